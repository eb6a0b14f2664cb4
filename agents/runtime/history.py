"""The agent's ring buffer of compact samples: one hour at the sampling rate, for `history` and sparklines."""

from __future__ import annotations

from collections import deque
from typing import Any

from agents.wire.protocol import Telemetry

HISTORY_S = 3600  # one hour of samples at the sampling rate


class History:
    """Ring buffer of compact samples: one hour at the sampling rate."""

    def __init__(self, interval_s: float):
        self.rows: deque[tuple[Any, ...]] = deque(maxlen=max(1, int(HISTORY_S / interval_s)))

    def add(self, t: Telemetry) -> None:
        gpus = tuple((g.util_pct, g.mem_used_bytes, g.temp_c, g.power_w) for g in t.gpus)
        self.rows.append((t.t, gpus, t.host.cpu_pct, t.host.ram_used_bytes))

    def export(self, since: float | None, max_points: int) -> dict[str, Any]:
        rows = [r for r in self.rows if since is None or r[0] > since]
        step = max(1, -(-len(rows) // max_points))  # ceil: keep at most max_points
        rows = rows[::step]
        n_gpus = max((len(r[1]) for r in rows), default=0)
        gpus = []
        for i in range(n_gpus):
            cols = [[r[1][i][k] if i < len(r[1]) else None for r in rows] for k in range(4)]
            gpus.append({"index": i, "util_pct": cols[0], "mem_used_bytes": cols[1], "temp_c": cols[2], "power_w": cols[3]})
        return {
            "t": [r[0] for r in rows],
            "gpus": gpus,
            "host": {"cpu_pct": [r[2] for r in rows], "ram_used_bytes": [r[3] for r in rows]},
        }
