"""Model files for the VRAM estimate's tests: a stand-in tokenizer, tiny GGUFs, safetensors folders, hostile headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

N_VOCAB = 1000


def fake_vocab(folder: Path) -> Path:
    """A GGUF with the tokenizer keys write_tiny_gguf copies (N_VOCAB made-up tokens): enough for the header's figures;
    llama-server itself needs llama.cpp's real one (tests/support/llamacpp.py)."""
    out = folder / "vocab.gguf"
    if out.exists():
        return out
    writer = GGUFWriter(str(out), "llama")
    writer.add_string("tokenizer.ggml.model", "llama")
    writer.add_string("tokenizer.ggml.pre", "default")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(N_VOCAB)])
    writer.add_array("tokenizer.ggml.scores", [0.0] * N_VOCAB)
    writer.add_array("tokenizer.ggml.token_type", [1] * N_VOCAB)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{key}", 1)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_bool("tokenizer.ggml.add_eos_token", False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def safetensors_model(folder: Path, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, shards: int = 2):
    """A Llama-shaped folder as transformers saves one: config.json and its weights over ``shards`` files (bf16 as
    float16 bytes; the safetensors library writes the headers). Returns (folder, the weights' bytes)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "vocab_size": 500,
    }
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((500, hidden)).astype(np.float16)}
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.standard_normal((hidden, hidden)).astype(np.float16)
        tensors[f"model.layers.{i}.self_attn.k_proj.weight"] = rng.standard_normal((hidden // heads * kv_heads, hidden)).astype(
            np.float16
        )
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
    names = sorted(tensors)
    total = 0
    for s in range(shards):
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(folder / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"))
        total += sum(a.nbytes for a in part.values())
    return folder, total


def gguf_bytes(n_tensors: int = 0, kv: list[bytes] | None = None, tensors: list[bytes] | None = None, version: int = 3) -> bytes:
    """A GGUF header by hand, for the shapes a writer refuses to make: counts as given, whatever follows."""
    items = kv or []
    return (
        b"GGUF"
        + struct.pack("<IQQ", version, n_tensors, len(items) if kv is not None else 0)
        + b"".join(items)
        + b"".join(tensors or [])
    )


def gguf_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def kv_u32(key: bytes, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def tensor_info(name: bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return (
        gguf_string(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )
