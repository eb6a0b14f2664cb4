"""A bounded reader of safetensors headers: each tensor's byte range, checked against its dtype, shape and the file.

A shard is an 8-byte little-endian length, that much JSON ({name: {dtype, shape, data_offsets}}, and
__metadata__), then the data. Only the length and the header are read, the header capped as the safetensors
library caps it; a corrupt or hostile one is a SafetensorsError naming the shard and the tensor.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from agents.wire.safe_read import open_regular

MAX_HEADER_BYTES = 100 * 1024**2  # the safetensors library's own cap
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}
DTYPE_BYTES |= {"I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}  # packed 4- and 6-bit: by offsets


class SafetensorsError(ValueError):
    """The shard is not a safetensors file this reader can trust: the message names it and what is wrong."""


def safetensors_weights(shard: Path) -> int:
    """The tensors' bytes in one shard, from its header alone (the 8-byte length, then that much JSON)."""
    fd = open_regular(shard.resolve())
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise SafetensorsError(f"{shard}: not a safetensors file: shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SafetensorsError(f"{shard}: not a safetensors file: a {n}-byte header in a {size}-byte file")
        raw = os.pread(fd, n, 8)
    finally:
        os.close(fd)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise SafetensorsError(f"{shard}: not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{shard}: not a safetensors file: its header is not a JSON object")
    data_bytes = size - 8 - n
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        total += _tensor_bytes(shard, name, info, data_bytes)
    return total


def _tensor_bytes(shard: Path, name: str, info: Any, data_bytes: int) -> int:
    where = f"{shard}: tensor {str(name)[:80]!r}"
    if not isinstance(info, dict):
        raise SafetensorsError(f"{where} is not described by an object")
    offsets, shape, dtype = info.get("data_offsets"), info.get("shape"), info.get("dtype")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise SafetensorsError(f"{where}: data_offsets {str(offsets)[:80]} are not within its {data_bytes} bytes of data")
    n = int(offsets[1]) - int(offsets[0])
    if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        width = DTYPE_BYTES.get(str(dtype))
        elements = 1
        for d in shape:
            elements *= d
        if width is not None and elements * width != n:
            raise SafetensorsError(f"{where}: {dtype} {shape} is {elements * width} bytes, its offsets say {n}")
    else:
        raise SafetensorsError(f"{where}: shape {str(shape)[:80]} is not a list of sizes")
    return n
