"""The console's own cost at scale, without the agents: 256 machines' ticks (8 simulated GPUs each, 1 Hz) fed to a headless console.

bench_console_scale.py runs the real agents too (32 processes at scale 256), which a small
machine cannot host beside the console: the console starves and the figure measures the
machine. Here the ticks are made ahead of time (the agents' work) and replayed as JSON lines
(the console decodes each, as it does off the wire), so the CPU figure is the console's:
decode, LabState, the scheduler and Textual's rendering. SSH's decryption is not in it.
Baseline, in the same run: the same console with nothing fed (nothing but the header to draw).

Usage: python bench/bench_console_feed.py [SCALE] [WINDOW_S] [--tmux]; run it in the tree to measure.
--tmux runs both consoles in a real terminal (a detached tmux session of 200x60) instead of headless:
the figure then includes writing the screen to a terminal.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from agents.shell.demo.lab import DemoLab
from agents.telemetry.sim import SimSampler
from agents.wire.lab.model import load_lab
from agents.wire.protocol import LinkStatus
from bench.common import CpuWindow, DrawnAges, percentile
from console.tui.app import CetlabApp
from console.tui.screens.fleet import FleetScreen

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
SCALE = int(ARGS[0]) if ARGS else 256
WINDOW_S = float(ARGS[1]) if len(ARGS) > 1 else 30.0
TMUX = "--tmux" in sys.argv
IN_TERMINAL = os.environ.get("CETLAB_BENCH_RESULT")  # set for the run inside tmux: where it writes its figures
PROFILE = os.environ.get("CETLAB_BENCH_PROFILE")
TICKS_AHEAD = 20
T_SLOT, FULL_SLOT = "@T@", "@FULL@"  # distinct ticks per machine, replayed in a loop
HOST = {
    "cpu_pct": 23.0,
    "cpu_count": 64,
    "load_1": 3.1,
    "ram_used_bytes": 96 * 1024**3,
    "ram_total_bytes": 512 * 1024**3,
    "disk_used_bytes": 1200 * 1024**3,
    "disk_total_bytes": 4000 * 1024**3,
}


def made_ticks(lab) -> dict[str, list[dict]]:
    """Per machine, diff ticks as an agent sends them: its GPUs and host every second, the cost figures."""
    ticks: dict[str, list[dict]] = {}
    for machine in lab.machines:
        sampler = SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
        ticks[machine.name] = []
        for n in range(TICKS_AHEAD):
            host = {**HOST, "cpu_pct": 20.0 + n % 7}
            costs = {
                "currency": "EUR",
                "power_w": 1800.0 + n,
                "now_per_hour": 0.5,
                "today": 1.0 + n / 1000,
                "month": 30.0,
                "cloud_equivalent_month": 300.0,
                "missing": [],
                "simulated": True,
            }
            ticks[machine.name].append(
                {"gpus": [g.model_dump(mode="json") for g in sampler.sample()], "host": host, "costs": costs}
            )
    return ticks


FED = [0]  # ticks applied so far


async def feed(app: CetlabApp, ticks: dict[str, list[dict]], stop: asyncio.Event) -> None:
    """Each machine's tick once a second, spread over the second as independent agents spread them."""
    names = list(ticks)
    # encoded ahead (the agents' work), with slots for the time and the full flag
    lines = {
        name: [
            json.dumps({"event": "tick", "data": {"t": T_SLOT, "full": FULL_SLOT, "changed": changed}})
            .replace(f'"{T_SLOT}"', T_SLOT)
            .replace(f'"{FULL_SLOT}"', FULL_SLOT)
            for changed in made
        ]
        for name, made in ticks.items()
    }
    n = 0
    started = time.monotonic()
    while not stop.is_set():
        for i, name in enumerate(names):
            due = started + n + i / len(names)
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # yields even when behind, as reads off sockets do
            line = (
                lines[name][n % TICKS_AHEAD]
                .replace(T_SLOT, repr(time.time()), 1)
                .replace(FULL_SLOT, "true" if n == 0 else "false", 1)
            )
            message = json.loads(line)  # what FleetClient._read does with each line off the wire
            app.state.apply_tick(name, message["data"])
            FED[0] += 1
        n += 1


Figures = tuple[float, list[float], list[float], list[float], float, float | None]


async def run_console(lab, ticks: dict[str, list[dict]] | None) -> Figures:
    """(CPU % of one core, data ages painted, on screen, in the state at each render tick, the share of the due ticks
    it managed to apply, seconds until every card was first drawn)."""
    app = CetlabApp(lab, connect=False)
    if not IN_TERMINAL:
        async with app.run_test(size=(200, 60)):
            return await measure(app, ticks)
    from console.tui.screens.base import LabScreen

    figures = []

    async def drive() -> None:
        while not (app.is_running and isinstance(app.screen, LabScreen) and app.screen.ready):
            await asyncio.sleep(0.05)
        figures.append(await measure(app, ticks))
        app.exit()

    driver = asyncio.create_task(drive())
    await app.run_async()
    await driver
    return figures[0]


async def measure(app: CetlabApp, ticks: dict[str, list[dict]] | None) -> Figures:
    drawn = DrawnAges(app)
    for name in app.state.machines:
        app.state.set_link(name, LinkStatus.ONLINE if ticks else LinkStatus.OFFLINE)
    stop = asyncio.Event()
    started = time.monotonic()
    feeder = asyncio.create_task(feed(app, ticks, stop)) if ticks else None
    first_drawn = None
    while ticks and time.monotonic() - started < 120:  # every machine's first tick in, and drawn: the start-up cost
        screen = app.screen
        if (
            all(view.gpus for view in app.state.machines.values())
            and isinstance(screen, FleetScreen)
            and screen.cards[0].gpu_lines
        ):
            first_drawn = time.monotonic() - started
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(5)  # past the first full ticks: the window measures the steady state
    app.render_ages.clear()
    drawn.clear()
    watcher = asyncio.create_task(drawn.watch())
    window, fed_before = CpuWindow(), FED[0]
    profiler = cProfile.Profile() if PROFILE and ticks else None  # CETLAB_BENCH_PROFILE=FILE: where the window's time goes
    if profiler:
        profiler.enable()
    await asyncio.sleep(WINDOW_S)
    cpu = window.share_pct()
    painted, on_screen = list(drawn.ages), list(drawn.on_screen)
    watcher.cancel()
    kept_up = (FED[0] - fed_before) / (len(app.state.machines) * WINDOW_S)
    if profiler:
        profiler.disable()
        profiler.dump_stats(str(PROFILE))
    stop.set()
    if feeder:
        await feeder
    drawn.close()
    return cpu, painted, on_screen, list(app.render_ages), kept_up, first_drawn


def in_tmux() -> None:
    """This script again, inside a detached tmux session of 200x60; its figures come back through a file."""
    import shutil
    import subprocess

    if shutil.which("tmux") is None:
        raise SystemExit("--tmux needs tmux (apt install tmux)")
    result = Path(tempfile.mkdtemp(prefix="cetlab-bench-tmux-")) / "result.txt"
    session = f"cetlab-bench-{os.getpid()}"
    command = f"CETLAB_BENCH_RESULT={result} {sys.executable} {Path(__file__).resolve()} {SCALE} {WINDOW_S:g}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "60", command], check=True, cwd=Path.cwd())
    try:
        while subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            time.sleep(1)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    if not result.exists():
        raise SystemExit("the run in tmux wrote no figures")
    print("in a real terminal (tmux, 200x60):")
    print(result.read_text(), end="")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cetlab-bench-feed-") as tmp:
        demo = DemoLab(Path(tmp), scale=SCALE)
        demo.prepare()  # lab.yaml, keys: no agents are started
        lab = load_lab(demo.lab_path)
    ticks = made_ticks(lab)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    base_cpu, *_ = await run_console(lab, None)
    cpu, painted, on_screen, ages, kept_up, first_drawn = await run_console(lab, ticks)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out: list[str] = []
    print = out.append
    print(
        f"{SCALE} machines, {SCALE * 8} simulated GPUs, ticks at 1 Hz fed in-process; window {WINDOW_S:.0f} s, {len(ages)} renders, "
        f"{len(painted)} card paints; load average {load_before} -> {load} (2 cores shared)"
    )
    print(
        f"every machine in and drawn {first_drawn:.1f} s after the first tick"
        if first_drawn
        else "not every machine was in within 120 s"
    )
    print(f"console, nothing fed (baseline): {base_cpu:5.1f}% of one core")
    print(
        f"console, {SCALE} machines fed    : {cpu:5.1f}% of one core  (goal < 25%: {'OK' if cpu < 25 else 'MISSED'}; "
        f"{cpu / max(base_cpu, 0.1):.1f}x the baseline)"
    )
    if kept_up < 0.97:  # a busy machine gave the console less CPU than the feed needs: say what it would take
        print(
            f"only {kept_up:.0%} of the due ticks were applied (the machine is busy): at full rate that is "
            f"{cpu / kept_up:5.1f}% of one core; the data ages below are the backlog's, not the console's"
        )
    p95 = percentile(painted, 95)
    print(
        f"data age as drawn (at each paint of a card's GPU lines, the age of the tick it shows): p50 {percentile(painted, 50):.2f} s  "
        f"p95 {p95:.2f} s  max {max(painted, default=float('nan')):.2f} s  (goal p95 <= 1.5 s: {'OK' if p95 <= 1.5 else 'MISSED'})"
    )
    print(
        f"data age on screen (the cards in view, every 0.25 s; a card not repainted ages too): p50 {percentile(on_screen, 50):.2f} s  "
        f"p95 {percentile(on_screen, 95):.2f} s  max {max(on_screen, default=float('nan')):.2f} s"
    )
    print(
        f"data age at each render tick in the state (as it arrived, not as drawn): p50 {percentile(ages, 50):.2f} s  "
        f"p95 {percentile(ages, 95):.2f} s"
    )

    text = "\n".join(out) + "\n"
    if IN_TERMINAL:
        Path(IN_TERMINAL).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    if TMUX:
        in_tmux()
    else:
        asyncio.run(main())
