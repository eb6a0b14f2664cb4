"""A tiny random-weight Llama as one GGUF file (and a GGUF LoRA adapter for it), for tests, benches and the demo.

The tokenizer is llama.cpp's own (models/ggml-vocab-llama-spm.gguf, 32000 SentencePiece tokens), copied
field by field, so llama-server tokenizes and detokenizes real text; the weights are random, so the
answers are nonsense, but every token is a real forward pass of llama.cpp.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, PoolingType, quants

TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
)
EMBED, LAYERS, HEADS, FFN, CONTEXT = 64, 2, 4, 128, 512
POOLING = {"embedding": PoolingType.MEAN, "rerank": PoolingType.RANK}
# the matrices' type (norms stay f32, as llama.cpp's quantizer keeps them) and GGUF's general.file_type for it
WEIGHT_TYPES = {
    "f32": (GGMLQuantizationType.F32, 0),
    "f16": (GGMLQuantizationType.F16, 1),
    "q8_0": (GGMLQuantizationType.Q8_0, 7),
    "q4_0": (GGMLQuantizationType.Q4_0, 2),
}


def _copy_field(writer: GGUFWriter, reader: GGUFReader, key: str) -> None:
    field = reader.fields[key]
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == GGUFValueType.STRING:
            values: list[Any] = [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        else:
            values = [field.parts[i].tolist()[0] for i in field.data]
        writer.add_array(key, values)
    elif kind == GGUFValueType.STRING:
        writer.add_string(key, bytes(field.parts[field.data[0]]).decode())
    elif kind == GGUFValueType.BOOL:
        writer.add_bool(key, bool(field.parts[field.data[0]][0]))
    else:
        writer.add_uint32(key, int(field.parts[field.data[0]][0]))


def write_tiny_gguf(
    out: Path,
    vocab: Path,
    seed: int = 0,
    name: str = "tiny-llama",
    embed: int = EMBED,
    layers: int = LAYERS,
    ffn: int = FFN,
    chat_template: str | None = None,
    serves: str = "chat",
    context: int = CONTEXT,
    heads_kv: int = HEADS,
    weight_type: str = "f32",
) -> Path:
    """A random Llama at ``out`` (by default 2 layers, f32, ~17 MB; benches ask for bigger), tokenizer from ``vocab``;
    with ``chat_template`` (e.g. agents.orchestra.engines.llamacpp.chat_templates.QWEN25) as its tokenizer.chat_template.

    serves="embedding" gives it mean pooling (llama-server --embedding answers a vector per input, as from an
    e5-mistral-like decoder); serves="rerank" rank pooling and a one-score classifier head (cls_out, as a
    Qwen3-Reranker carries), which llama-server --reranking reads as each document's relevance.

    ``context`` is its training context (llama-server's default -c), ``heads_kv`` below HEADS makes its attention
    grouped-query, ``weight_type`` (f32, f16, q8_0, q4_0) the type of its matrices.

    Over 80 lines: the GGUF's keys and tensors written in the order the format lays them out."""
    reader = GGUFReader(str(vocab))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    # llama.cpp reads a rank head (cls_out) on Qwen3, not on Llama: a reranker is a Qwen3 (its q and k normed per head)
    arch = "qwen3" if serves == "rerank" else "llama"
    writer = GGUFWriter(str(tmp), arch)
    writer.add_name(name)
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(embed)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(heads_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(embed // HEADS)
    writer.add_vocab_size(n_vocab)
    matrix_type, file_type = WEIGHT_TYPES[weight_type]
    writer.add_file_type(file_type)
    if serves != "chat":
        writer.add_pooling_type(POOLING[serves])
    if serves == "rerank":  # a yes/no head as Qwen3-Reranker's: llama-server's score is the softmax's "yes"
        writer.add_classifier_output_labels(["yes", "no"])
    for key in TOKENIZER_KEYS:
        _copy_field(writer, reader, key)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
        # llama-server feeds the template's generation prompt ("<|im_start|>assistant\n") to a tool-call or JSON
        # grammar token by token and drops a first token that starts with a space: SentencePiece's space prefix
        # (a first token " <") would lose the "<" and every constrained request fail with "Failed to initialize samplers"
        writer.add_add_space_prefix(False)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def add_matrix(name: str, *shape: int) -> None:
        data = weight(*shape)
        if matrix_type == GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif matrix_type == GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, quants.quantize(data, matrix_type), raw_dtype=matrix_type)

    kv_width = embed // HEADS * heads_kv
    add_matrix("token_embd.weight", n_vocab, embed)
    writer.add_tensor("output_norm.weight", np.ones(embed, dtype=np.float32))
    add_matrix("output.weight", n_vocab, embed)
    if serves == "rerank":
        writer.add_tensor("cls.output.weight", (rng.standard_normal((2, embed)) * 0.5).astype(np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(embed, dtype=np.float32))
        add_matrix(f"blk.{i}.attn_q.weight", embed, embed)
        add_matrix(f"blk.{i}.attn_k.weight", kv_width, embed)
        add_matrix(f"blk.{i}.attn_v.weight", kv_width, embed)
        add_matrix(f"blk.{i}.attn_output.weight", embed, embed)
        if arch == "qwen3":
            for t in ("attn_q_norm", "attn_k_norm"):
                writer.add_tensor(f"blk.{i}.{t}.weight", np.ones(embed // HEADS, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(embed, dtype=np.float32))
        add_matrix(f"blk.{i}.ffn_gate.weight", ffn, embed)
        add_matrix(f"blk.{i}.ffn_up.weight", ffn, embed)
        add_matrix(f"blk.{i}.ffn_down.weight", embed, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def write_tiny_lora_gguf(out: Path, rank: int = 4, seed: int = 1, alpha: float = 8.0) -> Path:
    """A GGUF LoRA adapter for write_tiny_gguf's model (q and v projections), as convert_lora_to_gguf.py writes one."""
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = GGUFWriter(str(tmp), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for i in range(LAYERS):
        for t in ("attn_q", "attn_v"):
            # numpy shapes are GGUF's ne reversed: lora_a ne=[n_in, r], lora_b ne=[r, n_out]
            writer.add_tensor(f"blk.{i}.{t}.weight.lora_a", (rng.standard_normal((rank, EMBED)) * 0.5).astype(np.float32))
            writer.add_tensor(f"blk.{i}.{t}.weight.lora_b", (rng.standard_normal((EMBED, rank)) * 0.5).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m agents.orchestra.engines.llamacpp.tiny_gguf OUT.gguf`: a tiny model to try the llamacpp engine with, no download."""
    import argparse

    from agents.orchestra.engines.llamacpp.build import MAKE_HINT, find_llama_server, vocab_file

    parser = argparse.ArgumentParser(prog="python -m agents.orchestra.engines.llamacpp.tiny_gguf", description=main.__doc__)
    parser.add_argument("out", type=Path, help="the GGUF file to write (~17 MB)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument("--lora", type=Path, metavar="FILE", help="also write a GGUF LoRA adapter for it here")
    args = parser.parse_args(argv)
    vocab = vocab_file()
    if vocab is None:  # llama.cpp's own tokenizer file comes with the build
        print(f"the tiny model takes llama.cpp's tokenizer from the cached build: {MAKE_HINT} first", file=sys.stderr)
        return 1
    write_tiny_gguf(args.out, vocab, seed=args.seed)
    print(f"wrote {args.out} (a random 2-layer Llama: its answers are nonsense, every token a real llama.cpp forward pass)")
    if args.lora:
        write_tiny_lora_gguf(args.lora)
        print(f"wrote {args.lora} (a LoRA adapter for it)")
    server = find_llama_server()
    print(f"try it: {server or 'llama-server'} -m {args.out} --port 8080, or in lab.yaml:")
    print(f"  - {{name: tiny-gguf, path: {args.out.resolve()}, engine: llamacpp, machine: <this machine>}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
