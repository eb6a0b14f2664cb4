"""Shared helpers for the benchmarks: percentiles, CPU share of a process over a window, the venv's commands."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil


def console_script(name: str) -> str:
    """The path of one of cetlab's commands beside the running Python: `make bench` does not put .venv/bin on PATH."""
    path = Path(sys.executable).parent / name  # not resolved: a venv's python is a link out of the venv
    if not path.is_file():
        raise SystemExit(f"{name} is not beside {sys.executable}: install cetlab into this Python (pip install -e '.[train]')")
    return str(path)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


class CpuWindow:
    """CPU seconds a process used over wall seconds: its share of one core."""

    def __init__(self, pid: int | None = None):
        self.proc = psutil.Process(pid)
        self.start()

    def start(self) -> None:
        times = self.proc.cpu_times()
        self.cpu0, self.wall0 = times.user + times.system, time.monotonic()

    def share_pct(self) -> float:
        times = self.proc.cpu_times()
        return (times.user + times.system - self.cpu0) / (time.monotonic() - self.wall0) * 100
