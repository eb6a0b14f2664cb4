"""Probes of hostile text (issue 30: R8, R9): R8 runs the CLI's logging (as `cetlab` sets it up) over an agent's hostile
error text and counts the control bytes that reach its stderr; R9 opens `:costs` headless on a report whose day is
markup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from bench.probes import probe
from console.lab.client import FleetClient

HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J[/b][bold red]EVIL[/]\x9b31m"


CLI_LOG = """
import logging, sys
from console.cli import main as cli
try:
    cli.main(["--help"])  # the CLI sets its logging up before it reads its arguments
except SystemExit:
    pass
logging.getLogger("cetlab.link").warning("%s: %s", "box", sys.argv[1])
"""


@probe("R8 agent text in the CLI's log")
async def r8_cli_log(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R8: an agent's error text logged by the CLI (an unanswered error reply): the control bytes on its stderr."""
    done = subprocess.run([sys.executable, "-c", CLI_LOG, HOSTILE], capture_output=True, timeout=60, check=False)
    controls = sum(done.stderr.count(c) for c in (b"\x1b", b"\x07", b"\xc2\x9b"))
    results["r8"] = {"control_bytes_on_stderr": controls, "stderr_bytes": len(done.stderr)}


@probe("R9 markup in costs' day")
async def r9_costs_day(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R9: a costs reply whose since.day is markup, through the console's summing and its `:costs` view (headless)."""
    from console.lab.costs import lab_costs
    from console.lab.state import LabState
    from console.tui.app import CetlabApp
    from console.tui.screens.costs import CostsScreen

    lab = load_lab(demo.lab_path)
    reply = {"machine": "box", "currency": "EUR", "timezone": "UTC", "since": {"day": "[/b]" + HOSTILE, "cost": 1.0}}
    report = lab_costs("EUR", {"box": reply})
    crashed: str | None = None
    if report.offline:  # refused where it entered: the view is shown an old-agent report with the same string
        report = report.model_copy(update={"since": "[/b]" + HOSTILE, "offline": {}})
    state = LabState(lab)
    app = CetlabApp(lab, client=FleetClient(lab, state), connect=False)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await app.switch_mode("costs")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, CostsScreen)
            screen.report = report
            screen.refresh_data()
            await pilot.pause()
    except Exception as exc:  # what every console that opened it did
        crashed = f"{type(exc).__name__}: {str(exc)[:80]}"
    results["r9"] = {"refused_on_the_wire": bool(lab_costs("EUR", {"box": reply}).offline), "view_crashed": crashed}
