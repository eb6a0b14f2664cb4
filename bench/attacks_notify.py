"""Probe of notifications (issue 30: R12): an endpoint that keeps refusing and an alert that flaps."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from bench.probes import probe
from console.lab.client import FleetClient


@probe("R12 a refusing endpoint and a flapping alert")
async def r12_notifications(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R12: the lab's pager refuses GPU 0's notifications (retried in an hour); GPU 1 then fires: whether its firing is
    delivered; then GPU 1 flaps 10 times: the rows its flapping added to the outbox (before: 2 per flap)."""
    import sqlite3

    db = sqlite3.connect(f"file:{demo.dir / 'agents' / 'box' / 'state.db'}?mode=ro", uri=True)

    def rows(where: str = "1") -> int:
        return int(db.execute(f"SELECT COUNT(*) FROM notify_outbox WHERE {where}").fetchone()[0])

    async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
        await client.wait_connected(10)

        async def firing(gpu: int) -> bool:
            alerts = (await client.call("box", "alerts.list", {"active": True}))["alerts"]
            return any(a["gpu"] == gpu and a["rule"] == "gpu_hot" for a in alerts)

        async def until(gpu: int, hot: bool) -> None:
            for _ in range(100):
                if await firing(gpu) == hot:
                    return
                await asyncio.sleep(0.1)

        async def set_temp(gpu: int, temp: float) -> None:
            await client.call("box", "sim.override", {"gpu": gpu, "temp_c": temp})
            await until(gpu, temp > 85)

        await set_temp(0, 95.0)
        await set_temp(1, 95.0)
        started, delivered_s = time.monotonic(), None
        while time.monotonic() - started < 10:
            if rows("key LIKE '%:firing' AND notification LIKE '%\"gpu\":1,%' AND delivered_at IS NOT NULL"):
                delivered_s = round(time.monotonic() - started, 1)
                break
            await asyncio.sleep(0.1)
        await set_temp(1, 40.0)
        before = rows()
        for _ in range(10):
            await set_temp(1, 95.0)
            await set_temp(1, 40.0)
        results["r12"] = {"gpu1_firing_delivered_after_s": delivered_s, "outbox_rows_for_10_flaps": rows() - before}
        await client.call("box", "sim.override", {"gpu": 0, "temp_c": 40.0})
