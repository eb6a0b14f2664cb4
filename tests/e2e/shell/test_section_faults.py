"""A component that starts failing is visible (issue 22 item 7): its section shows as failed, with the error, on the
console's view of it, the fleet card, the header, `cetlab status` and its JSON, and it recovers when the component does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from agents.jobs.component import JobsComponent
from agents.shell.agent import Agent
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.jobs import JobsScreen
from tests.support.screen_text import screen_lines
from tests.support.waits import until_drawn, wait_for

ERROR = "RuntimeError: the jobs table is gone [red]x[/red]"  # markup in an error is shown as text


def cli(lab_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(lab_path), *args], capture_output=True, text=True, timeout=60
    )


async def test_a_failing_section_is_shown_failed_on_the_console_and_the_cli_and_recovers(tmp_path, lab_file):
    source = lab_file(
        {
            "lab": "faults",
            "machines": [
                {"name": "box", "sample_interval_s": 0.2, "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}
            ],
        }
    )
    demo = DemoLab(tmp_path / "run", source=source)
    demo.prepare()  # keys, ports, known hosts; the agent runs here, real SSH on loopback, so the test can break a part of it
    lab = load_lab(demo.lab_path)
    agent = Agent(lab, "box", demo.dir / "agents" / "box")
    await agent.start()
    jobs = agent.find(JobsComponent)
    assert jobs is not None

    def broken_section():
        raise RuntimeError("the jobs table is gone [red]x[/red]")

    try:
        app = CetlabApp(lab)
        async with app.run_test(size=(160, 40)) as pilot:
            box = app.state.machines["box"]
            await wait_for(lambda: box.online and box.sample_t, timeout=30)
            await pilot.press("colon", *"jobs", "enter")
            await until_drawn(pilot, JobsScreen)
            assert not any("FAILED" in line for line in screen_lines(app))

            jobs.section = broken_section  # the component raises from the next tick on
            await wait_for(lambda: box.failed("jobs"), timeout=20)
            fault = box.failed("jobs")
            assert fault is not None and (fault.phase, fault.error) == ("section", ERROR)
            await until_drawn(pilot, JobsScreen)
            await wait_for(lambda: any("box: jobs FAILED since" in line for line in screen_lines(app)), timeout=10)
            lines = screen_lines(app)
            assert any(ERROR in line for line in lines), lines
            assert "1 SECTION FAILED" in lines[0], lines[0]

            status = await asyncio.to_thread(cli, demo.lab_path, "--json", "status")
            (machine,) = json.loads(status.stdout)["machines"]
            assert [(f["section"], f["phase"], f["error"]) for f in machine["sections_failed"]] == [("jobs", "section", ERROR)]
            human = await asyncio.to_thread(cli, demo.lab_path, "status")
            assert f"section jobs FAILED (section): {ERROR}" in human.stdout, human.stdout

            await pilot.press("escape")  # back to the fleet: the card says it too
            await until_drawn(pilot, FleetScreen)
            await wait_for(lambda: any(f"jobs failed (section): {ERROR}" in line for line in screen_lines(app)), timeout=10)
            assert any("✖ jobs failed" in line for line in screen_lines(app))

            del jobs.section  # it recovers: the next tick clears the fault everywhere
            await wait_for(lambda: not box.failed("jobs"), timeout=20)
            await until_drawn(pilot, FleetScreen)
            await wait_for(lambda: not any("failed" in line.casefold() for line in screen_lines(app)), timeout=10)
            await pilot.press("colon", *"jobs", "enter")
            await until_drawn(pilot, JobsScreen)
            await wait_for(lambda: not any("FAILED" in line for line in screen_lines(app)), timeout=10)
        status = await asyncio.to_thread(cli, demo.lab_path, "--json", "status")
        assert json.loads(status.stdout)["machines"][0]["sections_failed"] == []
    finally:
        await agent.stop()
