"""Redraws per tick of each console view on an idle demo lab: per-section versions against the lab-wide version.

The console runs headless (Textual's run_test) against the demo lab's real agents (real SSH, simulated GPUs), with
nothing done to the lab. For each view the scheduler's redraws are counted two ways in the same run: the rule the
console used before (redraw whenever the lab-wide LabState.version moved: every machine's tick bumps it) and the rule
it uses now (redraw when a section the view shows changed, LabScreen.SECTIONS, or its clock is due). Ticks are the
agents' tick messages the console received in the window.

    PYTHONPATH=. .venv/bin/python bench/bench_redraws.py [--lab LAB.yaml] [--window 15]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.base import LabScreen

VIEWS = ("jobs", "models", "checkpoints", "costs", "alerts", "audit", "gateway")


async def until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s")
        await asyncio.sleep(0.05)


async def measure(lab_path: Path, window_s: float) -> list[tuple[str, int, int, int]]:
    app = CetlabApp(load_lab(lab_path))
    rows = []
    async with app.run_test(size=(160, 50)) as pilot:
        machines = app.state.machines.values()
        await until(lambda: all(v.online and v.sample_t for v in machines), 60)
        for name in VIEWS:
            await app.switch_mode(name)
            await until(lambda: isinstance(app.screen, LabScreen) and app.screen.ready and app.screen.redraws > 0, 30)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, LabScreen)
            scheduler_tick = screen.tick
            seen = {"version": app.state.version, "old": 0}

            def counting(version: int, now: float, seen: dict[str, int] = seen, tick: Any = scheduler_tick) -> None:
                if version != seen["version"]:  # the old rule: any change anywhere in the lab redraws
                    seen["version"], seen["old"] = version, seen["old"] + 1
                tick(version, now)

            screen.tick = counting  # type: ignore[method-assign]  # a bench's probe, removed below
            ticks_before = sum(v.section_versions.get("series", 0) for v in machines)
            redraws_before = screen.redraws
            await asyncio.sleep(window_s)
            del screen.tick
            ticks = sum(v.section_versions.get("series", 0) for v in machines) - ticks_before
            rows.append((name, ticks, seen["old"], screen.redraws - redraws_before))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", type=Path, help="the source lab (default: the bundled demo lab)")
    parser.add_argument("--window", type=float, default=15.0, help="seconds measured per view")
    args = parser.parse_args()
    with DemoLab(Path(tempfile.mkdtemp(prefix="cetlab-bench-redraws-")) / "run", source=args.lab) as demo:
        demo.wait_listening()
        rows = asyncio.run(measure(demo.lab_path, args.window))
    print(f"idle demo lab, {args.window:.0f} s per view; ticks = tick messages from all agents")
    print(f"{'view':<12} {'ticks':>6} {'before':>7} {'after':>6} {'before/tick':>12} {'after/tick':>11}")
    for name, ticks, old, new in rows:
        print(f"{name:<12} {ticks:>6} {old:>7} {new:>6} {old / max(ticks, 1):>12.2f} {new / max(ticks, 1):>11.2f}")
    old_sum, new_sum, tick_sum = sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[1] for r in rows)
    print(
        f"{'all views':<12} {tick_sum:>6} {old_sum:>7} {new_sum:>6} {old_sum / max(tick_sum, 1):>12.2f} "
        f"{new_sum / max(tick_sum, 1):>11.2f}   after/before {new_sum / max(old_sum, 1):.2f}"
    )


if __name__ == "__main__":
    main()
