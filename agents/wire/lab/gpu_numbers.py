"""The one rule for a placement's GPU numbers in lab.yaml (a model's, a replica's, an rpc helper's, a recipe's node):
each must be one of its machine's GPUs. Known only for simulated GPUs; an NVML machine says at run time."""

from __future__ import annotations

from collections.abc import Sequence

from agents.wire.words import plural

Problem = tuple[tuple[str | int, ...], str]


def gpu_number_problems(machine: str, count: int | None, gpus: Sequence[int], where: tuple[str | int, ...]) -> list[Problem]:
    """Each GPU number of ``gpus`` (at ``where``, e.g. ("models", 0, "gpus")) that ``machine``, with ``count`` GPUs, lacks."""
    if count is None:
        return []
    return [
        ((*where, k), f"machine {machine} has {plural(count, 'GPU')} (0..{count - 1}), no GPU {gpu}")
        for k, gpu in enumerate(gpus)
        if gpu >= count
    ]
