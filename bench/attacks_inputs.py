"""Probes of what enters an agent (issue 30: R4, S1, S2): R4 asks the GPU support check's reader (as the agent's event
loop does) about a trainer Python that never answers; S1 tails 10,000 lines of a 10 MB log; S2 puts idle_watts 1e300
in lab.yaml."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from agents.shell.demo.lab import DemoLab
from bench.probes import probe


@probe("R4 a trainer Python that never answers")
async def r4_hanging_trainer_python(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R4: a trainer "python" whose torch probe waits on a FIFO nobody writes: how long the event loop's ask held the
    loop, and what the stack says once the probe's timeout has passed."""
    from agents.runtime.torch_probe import TorchReader

    with tempfile.TemporaryDirectory() as folder:
        fifo = Path(folder) / "never-written"
        os.mkfifo(fifo)
        python = Path(folder) / "python"
        python.write_text(f"#!/bin/sh\nread line < {fifo}\n")
        python.chmod(0o755)
        reader = TorchReader(timeout_s=3)
        started = time.monotonic()
        first = reader.peeking().stack(str(python))
        held = time.monotonic() - started
        after = await asyncio.to_thread(reader.stack, str(python))
    results["r4"] = {"loop_held_s": round(held, 3), "at_once": first.problem, "after_timeout": after.problem}


@probe("S2 idle_watts 1e300 in lab.yaml")
async def s2_huge_watts(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """Issue 30's small one: the demo's lab.yaml with a machine's idle_watts 1e300: refused, or the figure it loads."""
    import yaml

    from agents.wire.lab.model import LabError, parse_lab

    raw = yaml.safe_load(demo.lab_path.read_text())
    raw["machines"][0]["idle_watts"] = 1e300
    try:
        loaded: object = parse_lab(yaml.safe_dump(raw)).machines[0].idle_watts
    except LabError as exc:
        loaded = f"refused: {exc.problems[0][:120]}"
    results["s2"] = {"idle_watts_1e300": loaded}


@probe("S1 --tail 10000 of a 10 MB log")
async def s1_tail_of_10mb(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """Issue 30's small one: `--tail 10000` of a 10 MB log (1 kB lines): the lines that come back and whether it says cut."""
    from agents.jobs.logs import tail

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "job.log"
        log.write_text("".join(f"{i:06d} {'x' * 1016}\n" for i in range(10_000)))
        found = tail(log, 10_000)
    results["s1"] = {"asked": 10_000, "lines": len(found.lines), "says_cut": found.cut}
