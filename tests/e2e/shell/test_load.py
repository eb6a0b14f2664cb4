"""Load: 16 consoles subscribed to one agent plus 100 calls/s for 10 s; nothing dropped, p99 latency printed."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from tests.support.agent_process import connected

CONSOLES = 16


CALLS_PER_S = 100


DURATION_S = 10.0


MIX = [("ping", None), ("status", None), ("history", {"max_points": 60}), ("jobs.list", {"limit": 20}), ("methods", None)]


@pytest.mark.timeout(120)
async def test_sixteen_consoles_and_a_hundred_calls_per_second(small_demo):
    ticks = [0] * CONSOLES

    def counter(i: int):
        def on_event(machine: str, event: str, data) -> None:
            if event == "tick":
                ticks[i] += 1

        return on_event

    consoles = await asyncio.gather(*(connected(small_demo.lab_path, on_event=counter(i)) for i in range(CONSOLES)))
    try:
        assert all(c.state.machines["box"].online for c in consoles), [c.state.machines["box"].error for c in consoles]
        latencies: list[float] = []
        failures: list[str] = []

        async def one(n: int) -> None:
            method, params = MIX[n % len(MIX)]
            started = time.perf_counter()
            try:
                await consoles[n % CONSOLES].call("box", method, params, timeout=30)
                latencies.append(time.perf_counter() - started)
            except Exception as exc:
                failures.append(f"{method}: {exc}")

        ticks_before = list(ticks)
        calls = []
        started = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - started) < DURATION_S:
            while n < elapsed * CALLS_PER_S:  # keep the rate even if a sleep overshoots
                calls.append(asyncio.create_task(one(n)))
                n += 1
            await asyncio.sleep(0.005)  # the load's pace (the point), not a wait
        await asyncio.gather(*calls)
        wall_s = time.monotonic() - started
        got = [after - before for after, before in zip(ticks, ticks_before)]
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(
            f"\nload: {CONSOLES} consoles subscribed, {n} calls in {wall_s:.1f} s ({n / wall_s:.0f}/s): "
            f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms; "
            f"ticks per console {min(got)}..{max(got)}"
        )
        assert not failures, failures[:5]
        assert len(latencies) == n >= CALLS_PER_S * DURATION_S * 0.9  # every call answered
        assert min(got) >= DURATION_S / 2  # every console kept getting its 1 Hz ticks
    finally:
        await asyncio.gather(*(c.stop() for c in consoles))
