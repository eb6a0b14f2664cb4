"""A bounded reader of a GGUF file's header: its key-values and tensor infos, never its weights.

The format (llama.cpp's docs/gguf.md): magic "GGUF", version 2 or 3, tensor and key-value counts, the key-values,
then one info per tensor (name, dims, ggml type, offset into the data section). Every count, length and offset is
checked against the file's size and a cap before it is used, so a corrupt, truncated or hostile header is a
GgufError naming the file and the byte where it went wrong, never an unbounded read or allocation. The tokenizer's
long arrays are skipped, keeping only their length (the vocabulary size is all an estimate needs).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from agents.wire.safe_read import open_regular

MAGIC = b"GGUF"
MAX_TENSORS = 1 << 20  # a 671B MoE has ~1,100 tensors per file; a million is no model
MAX_KV = 1 << 16
MAX_KEY_BYTES = 1 << 16  # the spec caps keys at 65535 bytes
MAX_STRING_BYTES = 16 << 20  # the longest real values are chat templates, tens of KB
MAX_ARRAY_ITEMS = 1 << 22  # vocabularies and merges: a few hundred thousand
MAX_KEPT_ITEMS = 4096  # numeric arrays up to this long are kept (per-layer head counts); longer ones only counted
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER_BYTES = 1 << 30  # what the reader will walk through before the tensor data starts
READ_CHUNK = 1 << 20

# ggml type id -> (elements per block, bytes per block), as ggml's type traits (tests check it against the gguf package)
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
    40: (64, 36),  # NVFP4
    41: (128, 18),  # Q1_0
}
# llama.cpp's --cache-type-k/-v names (common/arg.cpp kv_cache_types) -> ggml type id
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}

# GGUF value types: id -> struct format of a scalar (8 string, 9 array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")

Value = int | float | bool | str | list[int] | list[float]


class GgufError(ValueError):
    """The file is not a GGUF this reader can trust: the message names the file and what is wrong where."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml's ne: the fastest-moving dimension first
    ggml_type: int
    offset: int  # into the data section

    @property
    def n_bytes(self) -> int:
        return row_bytes(self.ggml_type, self.dims[0]) * _product(self.dims[1:])


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    kv: dict[str, Value]
    array_lengths: dict[str, int]  # every array's length, kept or not (tokenizer.ggml.tokens: the vocabulary)
    tensors: list[TensorInfo]
    data_offset: int
    file_bytes: int

    @property
    def architecture(self) -> str:
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else ""

    def arch_int(self, key: str, default: int | None = None) -> int | None:
        """``{architecture}.{key}`` as a whole number (the largest of a per-layer array: see :meth:`per_layer`)."""
        value = self.kv.get(f"{self.architecture}.{key}")
        if isinstance(value, list):
            value = max(value) if value else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return default
        return int(value)

    def per_layer(self, key: str, n_layer: int, default: int) -> list[int]:
        """``{architecture}.{key}`` for each layer: a per-layer array as it is, a scalar repeated, else ``default``."""
        value = self.kv.get(f"{self.architecture}.{key}")
        if isinstance(value, list) and len(value) == n_layer:
            return [int(v) for v in value]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return [int(value)] * n_layer
        return [default] * n_layer


def row_bytes(ggml_type: int, n_elements: int) -> int:
    """Bytes of ``n_elements`` of one ggml type (a whole number of blocks: ggml_row_size)."""
    block, size = GGML_TYPES[ggml_type]
    return n_elements // block * size


def _product(values: tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


class _Cursor:
    """Reads forward through a file descriptor, every read checked against the file's size and the header cap."""

    def __init__(self, fd: int, size: int, path: Path) -> None:
        self.fd, self.size, self.path = fd, size, path
        self.pos = 0
        self.buf = b""
        self.buf_at = 0

    def fail(self, what: str) -> GgufError:
        return GgufError(f"{self.path}: not a usable GGUF: {what} (at byte {self.pos} of {self.size})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} runs past the end of the file (truncated?)")
        if self.pos + n > MAX_HEADER_BYTES:
            raise self.fail(f"the header is longer than {MAX_HEADER_BYTES >> 20} MiB")
        start = self.pos - self.buf_at
        if start + n > len(self.buf):
            self.buf = os.pread(self.fd, max(n, READ_CHUNK), self.pos)
            self.buf_at, start = self.pos, 0
            if len(self.buf) < n:
                raise self.fail(f"{what}: the file shrank while it was read")
        self.pos += n
        return self.buf[start : start + n]

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def count(self, cap: int, what: str) -> int:
        n = int(self.scalar("<Q", what))
        if n > cap:
            raise self.fail(f"{what} is {n}, more than {cap}")
        return n

    def skip_strings(self, n: int, what: str) -> None:
        """Walk over an array of n strings (a vocabulary: hundreds of thousands), within the buffer where it can."""
        length_at = _U64.unpack_from
        i = 0
        while i < n:
            buf, at, end = self.buf, self.pos - self.buf_at, len(self.buf)
            while i < n and at + 8 <= end:
                (length,) = length_at(buf, at)
                if length > MAX_STRING_BYTES or at + 8 + length > end:
                    break  # the careful path below says what is wrong, or reads on
                at += 8 + length
                i += 1
            self.pos = self.buf_at + at
            if i < n:
                self.take(self.count(MAX_STRING_BYTES, f"the length of {what}[{i}]"), f"{what}[{i}]")
                i += 1

    def string(self, cap: int, what: str) -> str:
        raw = self.take(self.count(cap, f"the length of {what}"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def read_gguf_header(path: Path) -> GgufHeader:
    """The header of the GGUF file at ``path``; GgufError when it is not one, or corrupt, truncated or beyond the caps.

    OSError (missing, unreadable, not a regular file) passes through."""
    fd = open_regular(Path(path).resolve())  # a model path may be a link (a Hugging Face cache); its target must be a file
    try:
        size = os.fstat(fd).st_size
        return _parse(_Cursor(fd, size, Path(path)))
    finally:
        os.close(fd)


def _parse(cur: _Cursor) -> GgufHeader:
    if cur.take(4, "the magic") != MAGIC:
        raise cur.fail("it does not start with GGUF")
    version = int(cur.scalar("<I", "the version"))
    if version not in (2, 3):
        raise cur.fail(f"GGUF version {version} (this reader knows 2 and 3)")
    n_tensors = cur.count(MAX_TENSORS, "the tensor count")
    n_kv = cur.count(MAX_KV, "the key-value count")
    kv: dict[str, Value] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = cur.string(MAX_KEY_BYTES, "a key")
        kind = int(cur.scalar("<I", f"the type of {key}"))
        if kind == ARRAY:
            sub = int(cur.scalar("<I", f"the item type of {key}"))
            n = cur.count(MAX_ARRAY_ITEMS, f"the length of {key}")
            lengths[key] = n
            kept = _array(cur, key, sub, n)
            if kept is not None:
                kv[key] = kept
        elif kind == STRING:
            kv[key] = cur.string(MAX_STRING_BYTES, key)
        elif kind in _SCALARS:
            kv[key] = cur.scalar(_SCALARS[kind], key)
        else:
            raise cur.fail(f"{key} has unknown value type {kind}")
    tensors = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = kv.get("general.alignment", 32)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment
    for t in tensors:
        if data_offset + t.offset + t.n_bytes > cur.size:
            raise GgufError(
                f"{cur.path}: not a usable GGUF: tensor {t.name} ({t.n_bytes} bytes at {data_offset + t.offset}) "
                f"runs past the end of the file ({cur.size} bytes: truncated?)"
            )
    return GgufHeader(cur.path, version, kv, lengths, tensors, data_offset, cur.size)


def _array(cur: _Cursor, key: str, sub: int, n: int) -> list[int] | list[float] | None:
    """A numeric array of at most MAX_KEPT_ITEMS, read; anything else walked over (strings one length at a time)."""
    if sub == STRING:
        cur.skip_strings(n, key)
        return None
    if sub not in _SCALARS:
        raise cur.fail(f"{key} is an array of unknown type {sub}")
    width = struct.calcsize(_SCALARS[sub])
    raw = cur.take(n * width, key)
    if n > MAX_KEPT_ITEMS:
        return None
    values: list[int] | list[float] = list(struct.unpack(f"<{n}{_SCALARS[sub][1]}", raw))
    return values


def _tensor_info(cur: _Cursor) -> TensorInfo:
    name = cur.string(MAX_KEY_BYTES, "a tensor name")
    n_dims = int(cur.scalar("<I", f"the dimension count of {name}"))
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = tuple(int(cur.scalar("<Q", f"a dimension of {name}")) for _ in range(n_dims))
    ggml_type = int(cur.scalar("<I", f"the type of {name}"))
    offset = int(cur.scalar("<Q", f"the offset of {name}"))
    if ggml_type not in GGML_TYPES:
        raise cur.fail(f"tensor {name} has ggml type {ggml_type}, which this reader does not know")
    block = GGML_TYPES[ggml_type][0]
    if any(d <= 0 for d in dims) or dims[0] % block:
        raise cur.fail(f"tensor {name} has dimensions {list(dims)} (each above 0, the first a multiple of {block})")
    if _product(dims) > cur.size * 256 or offset > cur.size:  # a block of 256 takes at least one byte
        raise cur.fail(f"tensor {name} ({list(dims)} at offset {offset}) is larger than the file")
    return TensorInfo(name, dims, ggml_type, offset)
