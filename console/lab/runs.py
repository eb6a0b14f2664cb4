"""One row per run: a multi-node job's run folder, seen by every node's agent when output_dir is on shared storage, is one run."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

Row = TypeVar("Row")


class RunKey(NamedTuple):
    machine: str
    run: str
    job: str | None  # the job id: every node of a multi-node job has the same one
    checkpoints: int  # complete checkpoints in the folder


def one_row_per_run(rows: list[Row], key: Callable[[Row], RunKey]) -> list[Row]:
    """Rows of the same run and job on several machines become one: the one with the most checkpoints, else the coordinator's.

    The coordinator is the machine the job id names (``m5-4`` is m5's). Runs of the same name
    without a job, or of different jobs, stay apart: they are different folders.
    """
    chosen: dict[tuple[str, str], Row] = {}
    for row in rows:
        k = key(row)
        if k.job is None:
            continue
        best = chosen.get((k.run, k.job))
        if best is None or _rank(k) > _rank(key(best)):
            chosen[(k.run, k.job)] = row
    return [row for row in rows if (k := key(row)).job is None or chosen[(k.run, k.job)] is row]


def _rank(k: RunKey) -> tuple[int, bool]:
    return k.checkpoints, k.job is not None and k.job.rsplit("-", 1)[0] == k.machine
