"""Shared helpers for the benchmarks: percentiles, CPU share of a process over a window."""

from __future__ import annotations

import time

import psutil


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
