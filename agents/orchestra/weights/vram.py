"""How much GPU memory a model needs: lab.yaml's vram_gib where typed, else an estimate from the model's own files.

GGUF (llama.cpp): the header's tensor infos give the weights byte for byte, by tensor type; the KV cache is what
llama.cpp allocates for the context its args ask for, n_layer x n_ctx x (n_head_kv x head_dim) for K and again
for V, at --cache-type-k/-v (f16 unless asked), n_ctx rounded up to 256 and split over -np slots as llama-server
does. With ``-ngl`` below the layer count only the offloaded layers' weights and KV count, as llama.cpp keeps the
rest (and always the token embeddings) in RAM. The compute buffer started from Ollama's graph-size rule for llama
(fs/ggml/ggml.go GraphSize: one micro-batch's activations or its logits, whichever is larger); measured against
llama-server it is the attention mask plus the largest of the micro-batch's phases (:func:`compute_bytes`). GPUStack's
gguf-parser walks the compute graph op by op per architecture; that is more exact for more architectures, and much
more code; the figure here is checked against llama-server's own buffer sizes instead (tests/e2e/orchestra/test_vram_llamacpp.py).

safetensors (vLLM, transformers): the weights are the tensors' byte ranges from each shard's JSON header (the
8-byte length and the header only); the KV cache is one sequence of max_model_len tokens (--max-model-len, else
config.json's max_position_embeddings), 2 x layers x kv_heads x head_dim at the cache dtype: the least vLLM starts
with. vLLM still takes --gpu-memory-utilization of each GPU whatever the estimate; only a vram_gib typed in lab.yaml
sets that share.

Each GPU adds a fixed CUDA context (and, for vLLM, activations and CUDA graphs) that no file says.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.orchestra.engine import GIB
from agents.orchestra.weights.gguf_header import CACHE_TYPES, GGML_TYPES, GgufError, GgufHeader, read_gguf_header
from agents.orchestra.weights.safetensors_header import SafetensorsError, safetensors_weights
from agents.wire.lab.model import Model
from agents.wire.safe_read import open_regular, read_capped
from agents.wire.sections.models import VramSource

MIB = 1024**2
CUDA_CONTEXT_BYTES = 512 * MIB  # per GPU: CUDA context and cuBLAS workspace (Ollama reserves ~457 MiB per GPU)
VLLM_OVERHEAD_BYTES = GIB  # per GPU: CUDA context, the profile run's activations and CUDA graphs
CTX_PAD = 256  # llama.cpp rounds n_ctx (and each slot's share) up to this
DEFAULT_UBATCH = 512  # llama.cpp's -ub
DEFAULT_BATCH = 2048  # llama.cpp's -b
AUTO_SLOTS = 4  # llama-server's -np auto
MAX_SHARDS = 4096
MAX_CONFIG_BYTES = 4 * MIB
CACHE_MAX = 256
DISAGREE_RATIO = 1.5  # lab.yaml's vram_gib and the estimate further apart than this (and 1 GiB): a doctor WARN
TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "float64": 8}  # anything else (bfloat16, float16, half, auto) is 2


class ModelFileError(ValueError):
    """The model's files cannot be read for an estimate: the message names the file and what is wrong."""


@dataclass(frozen=True)
class VramNeed:
    """What a model needs on its GPUs altogether (None: unknown), where that figure comes from, and how it was made."""

    bytes: int | None
    source: VramSource
    detail: str = ""
    unreadable: bool = False  # unknown because a model file is corrupt, truncated or refused (not missing, not another format)

    @property
    def known(self) -> bool:
        return self.bytes is not None

    def per_gpu(self, n_gpus: int) -> int:
        return int((self.bytes or 0) / max(1, n_gpus))


@dataclass(frozen=True)
class Estimate:
    """An estimate's parts, in bytes over all the model's GPUs."""

    weights: int
    kv: int
    compute: int
    overhead: int
    note: str  # the context, cache type, layers: what the figures assumed

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead

    def words(self) -> str:
        return (
            f"weights {gib(self.weights)} + KV cache {gib(self.kv)} + compute {gib(self.compute)}"
            f" + CUDA {gib(self.overhead)} ({self.note})"
        )


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def typed_need(model: Model) -> VramNeed:
    """lab.yaml's figure, without reading a file: unknown where it was left out (until the files are read)."""
    if model.vram_gib is not None:
        return VramNeed(int(model.vram_gib * GIB), "lab.yaml", f"vram_gib: {model.vram_gib:g} in lab.yaml")
    return VramNeed(None, "unknown", "not estimated yet")


def vram_need(model: Model, path: Path, n_gpus: int | None = None) -> VramNeed:
    """lab.yaml's vram_gib where typed, else the estimate from the model's files (cached by their size and mtime)."""
    typed = typed_need(model)
    if typed.known:
        return typed
    return estimate_files(path, model.args, n_gpus if n_gpus is not None else max(1, len(model.gpus)))


_cache: dict[tuple[Any, ...], VramNeed] = {}


def estimate_files(path: Path, args: list[str], n_gpus: int) -> VramNeed:
    """The estimate for the model at ``path`` (a GGUF file, or a folder of safetensors and config.json); an unknown
    VramNeed saying why when there is none (missing, another format, corrupt). Cached by the files' size and mtime,
    a refusal too: a corrupt header is read once, not at every look."""
    try:
        kind, files = _model_files(path)
        if kind is None:
            return VramNeed(None, "unknown", f"{path}: no GGUF file, nor safetensors with a config.json")
        stamp = tuple((str(f), s.st_size, s.st_mtime_ns) for f in files for s in [os.stat(f)])
    except FileNotFoundError:
        return VramNeed(None, "unknown", f"the model's files are missing: {path}")
    except (GgufError, SafetensorsError, ModelFileError, OSError) as exc:
        return _refused(path, exc)
    key = (kind, stamp, tuple(args), n_gpus)
    if key not in _cache:
        if len(_cache) >= CACHE_MAX:
            _cache.clear()
        _cache[key] = _estimate(kind, path, files, args, n_gpus)
    return _cache[key]


def _estimate(kind: str, path: Path, files: list[Path], args: list[str], n_gpus: int) -> VramNeed:
    try:
        if kind == "gguf":
            estimate = estimate_gguf(read_gguf_header(files[0]), args, n_gpus)
            return VramNeed(estimate.total, "estimated from GGUF header", estimate.words())
        estimate = estimate_safetensors(path, files, args, n_gpus)
        return VramNeed(estimate.total, "estimated from safetensors header", estimate.words())
    except FileNotFoundError:  # gone between the look and the read
        return VramNeed(None, "unknown", f"the model's files are missing: {path}")
    except (GgufError, SafetensorsError, ModelFileError, OSError) as exc:
        return _refused(path, exc)


def _refused(path: Path, exc: Exception) -> VramNeed:
    if isinstance(exc, GgufError | SafetensorsError | ModelFileError):
        return VramNeed(None, "unknown", str(exc), unreadable=True)
    assert isinstance(exc, OSError)
    return VramNeed(None, "unknown", f"{exc.filename or path}: {exc.strerror or exc}", unreadable=True)


def _model_files(path: Path) -> tuple[str | None, list[Path]]:
    """("gguf", [the file]) or ("safetensors", [config.json, shards...]) or (None, [])."""
    if not path.is_dir():
        os.stat(path)  # FileNotFoundError when it is missing
        return ("gguf", [path]) if path.name.lower().endswith(".gguf") or _is_gguf(path) else (None, [])
    shards = []
    for entry in os.scandir(path):
        if entry.name.endswith(".safetensors") and entry.is_file():
            shards.append(Path(entry.path))
            if len(shards) > MAX_SHARDS:
                raise ModelFileError(f"{path}: more than {MAX_SHARDS} safetensors files")
    config = path / "config.json"
    if shards and config.is_file():
        return "safetensors", [config, *sorted(shards)]
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf", ggufs
    return None, []


def _is_gguf(path: Path) -> bool:
    fd = open_regular(path.resolve())
    try:
        return os.pread(fd, 4, 0) == b"GGUF"
    finally:
        os.close(fd)


def disagreement(model: Model, path: Path) -> str | None:
    """What the doctor warns of: lab.yaml's vram_gib far from the files' estimate (over 1.5 times apart and 1 GiB),
    or no estimate from files that are there but unreadable, where lab.yaml gives no figure. None: nothing to say."""
    estimate = estimate_files(path, model.args, max(1, len(model.gpus)))
    if model.vram_gib is None:
        if estimate.unreadable:
            return f"its VRAM need is unknown: {estimate.detail}; placement cannot check it fits (set vram_gib in lab.yaml)"
        return None
    if estimate.bytes is None:
        return None
    typed = model.vram_gib * GIB
    low, high = sorted((typed, float(estimate.bytes)))
    if high - low >= GIB and high > DISAGREE_RATIO * low:
        return (
            f"lab.yaml says vram_gib: {model.vram_gib:g}, its files say {gib(estimate.bytes)} ({estimate.source}: "
            f"{estimate.detail}); placement goes by lab.yaml's figure"
        )
    return None


# ---------------------------------------------------------------------------- args


def flag(args: list[str], *names: str) -> str | None:
    """The value of the last of ``names`` in ``args`` (``--name V`` or ``--name=V``); None when absent."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def int_flag(args: list[str], *names: str) -> int | None:
    text = flag(args, *names)
    if text is None:
        return None
    match = re.fullmatch(r"\s*(-?\d+)\s*([kKmM]?)\s*", text)
    if match is None:
        raise ModelFileError(f"{names[0]} {text!r} in the model's args is not a whole number")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[match.group(2).lower()]
    return int(match.group(1)) * scale


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


# ---------------------------------------------------------------------------- GGUF


def kv_row_bytes(ggml_type: int, n_elements: int) -> int:
    block, size = GGML_TYPES[ggml_type]
    return -(-n_elements // block) * size


def _cache_type(args: list[str], *names: str) -> tuple[str, int]:
    name = (flag(args, *names) or "f16").lower()
    if name not in CACHE_TYPES:
        raise ModelFileError(f"{names[-1]} {name!r} in the model's args: llama.cpp knows {', '.join(CACHE_TYPES)}")
    return name, CACHE_TYPES[name]


def gguf_context(header: GgufHeader, args: list[str]) -> tuple[int, int, int]:
    """(the KV cache's cells, the cells one sequence sees, the slots) as llama-server sizes them: -c (0 or absent: the
    model's training context) rounded up to 256; -np N without --kv-unified gives each slot its share, rounded up to
    256 (llama_context's n_ctx_seq); llama-server's default (-np auto) is 4 slots sharing one cache."""
    n_ctx = _pad(int_flag(args, "-c", "--ctx-size") or header.arch_int("context_length", 4096) or 4096, CTX_PAD)
    slots = int_flag(args, "-np", "--parallel")
    if slots is None or slots <= 0:
        return n_ctx, n_ctx, AUTO_SLOTS
    if any(a in ("-kvu", "--kv-unified") for a in args):
        return n_ctx, n_ctx, slots
    per_slot = _pad(n_ctx // slots, CTX_PAD)
    return per_slot * slots, per_slot, slots


def compute_bytes(
    header: GgufHeader, args: list[str], n_embd: int, n_head: int, kv_width: int, n_ctx: int, seq_cells: int, slots: int
) -> int:
    """llama.cpp's compute buffer for one GPU, fitted to llama-server's own (tests/e2e/orchestra/test_vram_llamacpp.py): the attention
    mask over the cells one sequence sees (f16 with flash attention, else f32), live through the whole micro-batch,
    plus the largest of its phases, as the allocator reuses memory between them: the feed-forward (gate, up and their
    product, n_ff wide, beside the residual stream), the attention (without flash attention, every head's f32 scores),
    and the logits of the outputs a server step asks for (one per slot; every token for an embedding model).
    ``kv_width``: n_head_kv x head_dim, what grouped-query attention keeps of K and V per token."""
    n_ff = header.arch_int("feed_forward_length", 4 * n_embd) or 4 * n_embd
    vocab = header.array_lengths.get("tokenizer.ggml.tokens") or header.arch_int("vocab_size", 0) or 0
    batch = min(int_flag(args, "-b", "--batch-size") or DEFAULT_BATCH, n_ctx)
    ubatch = min(int_flag(args, "-ub", "--ubatch-size") or DEFAULT_UBATCH, batch)
    flash = (flag(args, "-fa", "--flash-attn") or "auto").lower() not in ("off", "0", "false", "disabled")
    mask = (2 if flash else 4) * ubatch * seq_cells
    feed_forward = 4 * ubatch * (3 * n_ff + 4 * n_embd)
    attention = 4 * ubatch * (2 * n_embd + 6 * kv_width) if flash else 4 * ubatch * (seq_cells * n_head + 7 * n_embd)
    pooled = header.kv.get(f"{header.architecture}.pooling_type") not in (None, 0)  # embeddings: every token an output
    logits = 4 * (ubatch if pooled else slots) * (n_embd + vocab)
    return mask + max(feed_forward, attention, logits)


def estimate_gguf(header: GgufHeader, args: list[str], n_gpus: int = 1) -> Estimate:
    """The GPU memory llama-server takes for this GGUF with these args (see the module's docstring for the rules)."""
    arch = header.architecture or "?"
    n_layer = header.arch_int("block_count")
    n_embd = header.arch_int("embedding_length")
    if not n_layer or not n_embd or n_layer <= 0 or n_embd <= 0:
        raise ModelFileError(f"{header.path}: no {arch}.block_count or {arch}.embedding_length in its header")
    heads = header.per_layer("attention.head_count", n_layer, 0)
    n_head = max(heads)
    heads_kv = header.kv.get(f"{arch}.attention.head_count_kv")
    kv_heads = header.per_layer("attention.head_count_kv", n_layer, 0) if heads_kv is not None else heads
    key_len = header.arch_int("attention.key_length") or (n_embd // n_head if n_head else 0)
    value_len = header.arch_int("attention.value_length") or key_len
    n_ctx, seq_cells, slots = gguf_context(header, args)
    k_name, k_type = _cache_type(args, "-ctk", "--cache-type-k")
    v_name, v_type = _cache_type(args, "-ctv", "--cache-type-v")
    ngl = int_flag(args, "-ngl", "--gpu-layers", "--n-gpu-layers")
    all_layers = ngl is None or ngl < 0 or ngl > n_layer  # -1 (auto) fits them all where they fit; -2 or less: all
    on_gpu = n_layer if ngl is None or ngl < 0 else min(ngl, n_layer)
    first_gpu_layer = n_layer - on_gpu  # llama.cpp offloads the last layers
    names = {t.name for t in header.tensors}
    weights = 0
    for t in header.tensors:
        layer = _layer_of(t.name)
        if layer is not None:
            weights += t.n_bytes if layer >= first_gpu_layer else 0
        elif t.name == "token_embd.weight":  # the input embedding stays in RAM; tied to the output, it is copied over
            weights += t.n_bytes if all_layers and "output.weight" not in names else 0
        elif all_layers:
            weights += t.n_bytes
    kv = sum(
        n_ctx * (kv_row_bytes(k_type, kv_heads[i] * key_len) + kv_row_bytes(v_type, kv_heads[i] * value_len))
        for i in range(first_gpu_layer, n_layer)
    )
    compute = compute_bytes(header, args, n_embd, n_head, max(kv_heads) * key_len, n_ctx, seq_cells, slots) * max(1, n_gpus)
    layers = f"{on_gpu} of {n_layer} layers" if on_gpu < n_layer else f"{n_layer} layers"
    cache = k_name if k_name == v_name else f"K {k_name}, V {v_name}"
    return Estimate(weights, kv, compute, CUDA_CONTEXT_BYTES * max(1, n_gpus), f"{n_ctx} tokens of {cache} cache, {layers}")


def gguf_weights_bytes(header: GgufHeader) -> int:
    """Every tensor's bytes: what llama.cpp maps from the file (its "model buffer size"s together)."""
    return sum(t.n_bytes for t in header.tensors)


def _layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    number = name[4:].split(".", 1)[0]
    return int(number) if number.isdigit() else None


# ---------------------------------------------------------------------------- safetensors


def _config_int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def estimate_safetensors(folder: Path, files: list[Path], args: list[str], n_gpus: int = 1) -> Estimate:
    """vLLM's least: the weights, one max_model_len sequence of KV cache, and its per-GPU overhead."""
    config_path, shards = files[0], files[1:]
    try:
        config = json.loads(read_capped(config_path, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError):
        raise ModelFileError(f"{config_path}: not JSON") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"{config_path}: not a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict):  # a multimodal model: its language model's shape
        config = {**config, **text}
    weights = sum(safetensors_weights(shard) for shard in shards)
    layers = _config_int(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _config_int(config, "num_attention_heads", "n_head")
    hidden = _config_int(config, "hidden_size", "n_embd", "d_model")
    if layers is None or heads is None or hidden is None:
        raise ModelFileError(f"{config_path}: no num_hidden_layers, num_attention_heads or hidden_size")
    kv_heads = _config_int(config, "num_key_value_heads", "num_kv_heads") or heads
    head_dim = _config_int(config, "head_dim") or hidden // heads
    max_len = int_flag(args, "--max-model-len") or _config_int(
        config, "max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"
    )
    if max_len is None:
        raise ModelFileError(f"{config_path}: no max_position_embeddings; give --max-model-len in the model's args")
    cache_dtype = (flag(args, "--kv-cache-dtype") or "auto").lower()
    dtype = str(flag(args, "--dtype") or config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower()
    width = 1 if cache_dtype.startswith("fp8") else TORCH_DTYPE_BYTES.get(dtype, 2)
    kv = 2 * layers * kv_heads * head_dim * max_len * width
    note = f"one sequence of {max_len} tokens at {width} bytes, {layers} layers"
    return Estimate(weights, kv, 0, VLLM_OVERHEAD_BYTES * max(1, n_gpus), note)
