"""The console at scale: `cetlab demo --scale 64` (512 simulated GPUs at 1 Hz) on one screen.

Goals (issue 2): data age at each render tick p95 <= 1.5 s; the console process under 25% of one core.
Data age = render tick time minus the agent's sample time of the newest sample in the console's
state (the oldest machine counts at each tick): what a view redraws from at that tick, not read
back from what its widgets drew (a card off screen, or unchanged, is not redrawn). The baseline is the same console with every machine
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

from agents.lab import load_lab  # noqa: E402
from bench.common import CpuWindow, percentile  # noqa: E402
from console.app import CetlabApp  # noqa: E402

SCALE = int(os.environ.get("CETLAB_BENCH_SCALE", "64"))
WINDOW_S = float(os.environ.get("CETLAB_BENCH_WINDOW_S", "60"))


async def run_console(lab_path: Path, connect: bool) -> tuple[float, list[float], int]:
    app = CetlabApp(load_lab(lab_path), connect=connect)
    async with app.run_test(size=(200, 60)):
        if connect:
            deadline = time.monotonic() + 120
            while sum(v.online for v in app.state.machines.values()) < SCALE and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(5)  # past the first full snapshots
        app.render_ages.clear()
        window = CpuWindow()
        await asyncio.sleep(WINDOW_S)
        cpu = window.share_pct()
        online = sum(v.online for v in app.state.machines.values())
        return cpu, list(app.render_ages), online


async def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="cetlab-bench-scale-"))
    demo = subprocess.Popen([sys.executable, "-m", "console.cli", "demo", "--dir", str(directory), "--scale", str(SCALE)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = demo.stdout.readline()
        if "demo lab running" not in line:
            raise SystemExit(f"demo did not start: {line}{demo.stdout.read()}")
        lab_path = directory / "lab.yaml"
        base_cpu, _, _ = await run_console(lab_path, connect=False)
        cpu, ages, online = await run_console(lab_path, connect=True)
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=30)
    p95 = percentile(ages, 95)
    print(f"{SCALE} machines, {SCALE * 8} simulated GPUs at 1 Hz, {online} online, window {WINDOW_S:.0f} s, {len(ages)} renders")
    print(f"console, nothing connected (baseline): {base_cpu:5.1f}% of one core")
    print(f"console, {online} machines live        : {cpu:5.1f}% of one core  (goal < 25%: {'OK' if cpu < 25 else 'MISSED'}; "
          f"{cpu / max(base_cpu, 0.1):.1f}x the baseline)")
    print(f"data age at each render tick (the console state's newest sample, not read back from the widgets): p50 {percentile(ages, 50):.2f} s  p95 {p95:.2f} s  max {max(ages, default=float('nan')):.2f} s  "
          f"(goal p95 <= 1.5 s: {'OK' if p95 <= 1.5 else 'MISSED'})")


if __name__ == "__main__":
    asyncio.run(main())
