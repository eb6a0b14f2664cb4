"""The console at scale: `cetlab demo --scale 64` (512 simulated GPUs at 1 Hz) on one screen.

Goals (issues 2, 22): data age as drawn p95 <= 1.5 s; the console process under 25% of one core.
Data age as drawn = at each paint of a machine card's GPU lines, the console's clock minus the agent's
sample time of the tick that card shows (bench.common.DrawnAges). Also printed: the same sampled on a
clock over the cards in view, and the old figure (the newest sample in the console's state at each
render tick: the data as it arrived, not as drawn). The baseline is the same console with every machine
offline (nothing to draw but the cards), measured in the same run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.wire.lab.model import load_lab
from bench.common import CpuWindow, DrawnAges, percentile, this_checkout_first
from console.tui.app import CetlabApp

SCALE = int(os.environ.get("CETLAB_BENCH_SCALE", "64"))
WINDOW_S = float(os.environ.get("CETLAB_BENCH_WINDOW_S", "60"))


async def run_console(lab_path: Path, connect: bool) -> tuple[float, list[float], list[float], list[float], int]:
    """(CPU % of one core, data ages painted, on screen, in the state at each render tick, machines online)."""
    app = CetlabApp(load_lab(lab_path), connect=connect)
    drawn = DrawnAges(app)
    async with app.run_test(size=(200, 60)):
        if connect:
            deadline = time.monotonic() + 120
            while sum(v.online for v in app.state.machines.values()) < SCALE and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(5)  # past the first full snapshots
        app.render_ages.clear()
        drawn.clear()
        watcher = asyncio.create_task(drawn.watch())
        window = CpuWindow()
        await asyncio.sleep(WINDOW_S)
        cpu = window.share_pct()
        watcher.cancel()
        online = sum(v.online for v in app.state.machines.values())
        painted, on_screen = list(drawn.ages), list(drawn.on_screen)
    drawn.close()
    return cpu, painted, on_screen, list(app.render_ages), online


async def main() -> None:
    this_checkout_first()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    directory = Path(tempfile.mkdtemp(prefix="cetlab-bench-scale-"))
    demo = subprocess.Popen(
        [sys.executable, "-m", "console.cli.main", "demo", "--dir", str(directory), "--scale", str(SCALE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()
        if "demo lab running" not in line:
            raise SystemExit(f"demo did not start: {line}{demo.stdout.read()}")
        lab_path = directory / "lab.yaml"
        base_cpu, *_ = await run_console(lab_path, connect=False)
        cpu, painted, on_screen, ages, online = await run_console(lab_path, connect=True)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=30)
    p95 = percentile(painted, 95)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{SCALE} machines, {SCALE * 8} simulated GPUs at 1 Hz, {online} online, window {WINDOW_S:.0f} s, {len(ages)} renders, "
        f"{len(painted)} card paints; load average {load_before} -> {load}"
    )
    print(f"console, nothing connected (baseline): {base_cpu:5.1f}% of one core")
    print(
        f"console, {online} machines live        : {cpu:5.1f}% of one core  (goal < 25%: {'OK' if cpu < 25 else 'MISSED'}; "
        f"{cpu / max(base_cpu, 0.1):.1f}x the baseline)"
    )
    print(
        f"data age as drawn (at each paint of a card's GPU lines, the age of the tick it shows): p50 {percentile(painted, 50):.2f} s  "
        f"p95 {p95:.2f} s  max {max(painted, default=float('nan')):.2f} s  (goal p95 <= 1.5 s: {'OK' if p95 <= 1.5 else 'MISSED'})"
    )
    print(
        f"data age on screen (the cards in view, every 0.25 s): p50 {percentile(on_screen, 50):.2f} s  p95 {percentile(on_screen, 95):.2f} s"
    )
    print(
        f"data age at each render tick in the state (as it arrived, not as drawn): p50 {percentile(ages, 50):.2f} s  "
        f"p95 {percentile(ages, 95):.2f} s"
    )


if __name__ == "__main__":
    asyncio.run(main())
