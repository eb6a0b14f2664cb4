"""Compute capabilities: parsing "6.1", and the capability of a GPU by its name (for simulated GPUs)."""

from __future__ import annotations

import re
from functools import lru_cache

from agents.wire.protocol import ComputeCapability

# GPU name (as NVML spells it, matched case-insensitively, longest first) -> compute capability.
# From NVIDIA's CUDA GPU table; what a simulated GPU of that name defaults to.
BY_NAME: dict[str, tuple[int, int]] = {
    "Tesla K80": (3, 7),
    "Tesla M40": (5, 2),
    "Tesla M60": (5, 2),
    "Tesla P100": (6, 0),
    "Tesla P40": (6, 1),
    "Tesla P4": (6, 1),
    "Quadro P1000": (6, 1),
    "Quadro P2000": (6, 1),
    "Quadro P4000": (6, 1),
    "GTX 1080": (6, 1),
    "GTX 1070": (6, 1),
    "GTX 1060": (6, 1),
    "TITAN Xp": (6, 1),
    "Tesla V100": (7, 0),
    "TITAN V": (7, 0),
    "Quadro GV100": (7, 0),
    "Tesla T4": (7, 5),
    "RTX 2080": (7, 5),
    "RTX 2070": (7, 5),
    "RTX 2060": (7, 5),
    "Quadro RTX": (7, 5),
    "A100": (8, 0),
    "A30": (8, 0),
    "A10": (8, 6),
    "A40": (8, 6),
    "A16": (8, 6),
    "RTX A6000": (8, 6),
    "RTX A4000": (8, 6),
    "RTX 3090": (8, 6),
    "RTX 3080": (8, 6),
    "RTX 3070": (8, 6),
    "RTX 3060": (8, 6),
    "RTX 3050": (8, 6),
    "L4": (8, 9),
    "L40": (8, 9),
    "RTX 4090": (8, 9),
    "RTX 4080": (8, 9),
    "RTX 4070": (8, 9),
    "RTX 4060": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "GH200": (9, 0),
    "B200": (10, 0),
    "RTX 5090": (12, 0),
    "RTX 5080": (12, 0),
}
_PATTERN = re.compile(r"^(\d{1,2})\.(\d)$")


def parse_capability(text: str) -> ComputeCapability:
    """ "6.1" -> 6.1; raises ValueError naming the expected form."""
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"expected a compute capability like 6.1 or 8.6, got {text!r}")
    return ComputeCapability(major=int(match[1]), minor=int(match[2]))


def capability_by_name(name: str) -> ComputeCapability | None:
    """The capability of a GPU model from its name ("Tesla P40" -> 6.1); None for a name the table lacks."""
    found = _by_name(name.lower())
    return None if found is None else ComputeCapability(major=found[0], minor=found[1])


@lru_cache(maxsize=256)  # the simulator asks for every GPU at every sample: the table is searched once per name
def _by_name(lowered: str) -> tuple[int, int] | None:
    for known in sorted(BY_NAME, key=len, reverse=True):
        if re.search(rf"(^|[\s-]){re.escape(known.lower())}($|[\s-])", lowered):
            return BY_NAME[known]
    return None
