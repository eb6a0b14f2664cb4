"""The energy ledger and money: hand-computed sequences, attribution, tokens, prices, persistence across kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.costs.component import JOULES_PER_KWH

# ---------------------------------------------------------------------------- real agents over SSH
from agents.shell.demo.lab import DemoLab

# ---------------------------------------------------------------------------- the console
from agents.wire.lab.model import (
    load_lab,
)
from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.costs import CostsScreen
from tests.support.costs_header import header
from tests.support.lab import run_agent
from tests.support.waits import wait_for

LAB = {
    "lab": "cost-lab",
    "costs": {"currency": "EUR", "electricity_per_kwh": 0.30, "timezone": "Europe/Berlin"},
    "cloud_prices": {"gpu_hour": {"Tesla P4": 0.60}},
    "machines": [
        {
            "name": "box",
            "idle_watts": 100,
            "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75, "profile": "training"}]},
        }
    ],
}


def db_joules(state_dir: Path) -> float:
    try:
        db = sqlite3.connect(f"file:{state_dir / 'state.db'}?mode=ro", uri=True)
        try:
            return db.execute("SELECT COALESCE(SUM(energy_j), 0) FROM cost_ledger").fetchone()[0]
        finally:
            db.close()
    except sqlite3.OperationalError:  # the agent has not created it yet
        return 0.0


async def month_joules(lab_path: Path) -> float:
    from agents.wire.lab.model import load_lab

    async with FleetClient(load_lab(lab_path), subscribe=[]) as client:  # reconnects until the agent listens
        await wait_for(lambda: client.state.machines["box"].online, timeout=30)
        report = await client.call("box", "costs.get", {})
    return report["month"]["kwh"] * JOULES_PER_KWH


MAX_W = 200  # the test lab's sim GPU and idle draw stay under this


@pytest.mark.timeout(90)
async def test_energy_survives_kill_9_of_the_agent(tmp_path, lab_file):
    demo = DemoLab(tmp_path / "run", source=lab_file(LAB))
    lab_path = demo.prepare()
    state_dir = demo.dir / "agents" / "box"
    proc = run_agent(lab_path, "box", state_dir)
    try:
        await wait_for(lambda: db_joules(state_dir) > 1000, timeout=40)  # a few ticks of ~170 W
        reported = await month_joules(lab_path)
        answered = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        kept = db_joules(state_dir)
        # Everything reported is on disk; newer are only the ticks between the answer and the kill
        # (at most one per second of that span, plus the tick in flight, each under MAX_W).
        assert reported - 4 <= kept <= reported + (killed - answered + 2) * MAX_W
        proc = run_agent(lab_path, "box", state_dir)
        restarted = time.monotonic()
        after = await month_joules(lab_path)
        up_s = time.monotonic() - restarted
        assert after >= kept - 4  # the restarted agent continues the same ledger
        # and books only its own uptime: the downtime is never bridged with energy
        assert after <= kept + (up_s + 2) * MAX_W
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.timeout(60)
async def test_cli_costs_json_over_ssh(small_demo):
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "console.cli.main", "--lab", str(small_demo.lab_path), "--json", "costs", "--by", "machine"],
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert out.returncode == 0, out.stderr
    data = __import__("json").loads(out.stdout)
    assert {
        "currency",
        "now_per_hour",
        "today",
        "month",
        "cloud_equivalent_today",
        "cloud_equivalent_month",
        "saving_pct_month",
        "by",
        "simulated",
    } <= data.keys()
    assert data["simulated"] is True and data["currency"] == "USD"
    # the default test lab names no electricity price and no cloud price: the counter says so
    assert data["now_per_hour"] is None and "missing: costs.electricity_per_kwh" in data["missing"]
    assert [b["machine"] for b in data["by"]] == ["box"]


@pytest.mark.timeout(90)
async def test_a_running_job_is_charged_for_its_gpu(tmp_path, lab_file):
    lab = {
        **LAB,
        "trainers": [
            {
                "name": "sleeper",
                "machine": "box",
                "gpus": [0],
                "output_dir": str(tmp_path / "out" / "{job_id}"),
                "command": [sys.executable, "-c", "import time; time.sleep(120)"],
                "stop_grace_s": "2s",
            }
        ],
    }
    with DemoLab(tmp_path / "run", source=lab_file(lab)) as demo:
        from agents.wire.lab.model import load_lab

        async with FleetClient(load_lab(demo.lab_path), subscribe=["tick"]) as client:
            box = client.state.machines["box"]
            await wait_for(lambda: box.online, timeout=30)
            job = await client.call("box", "jobs.start", {"recipe": "sleeper"})
            jobs = lambda: [j for j in box.jobs if j.id == job["id"] and j.state == "running"]  # noqa: E731
            await wait_for(jobs, timeout=30)

            async def charged() -> dict | None:
                report = await client.call("box", "costs.get", {"by": "job"})
                return next((e for e in report["by"] if e["job"] == job["id"] and e["gpu_hours"] * 3600 >= 3), None)

            entry = await wait_for(charged, timeout=40, interval=0.2)  # the job is charged
            assert entry["label"] == "sleeper" and entry["machine"] == "box" and entry["kwh"] > 0
            assert entry["cost"] == pytest.approx(entry["kwh"] * 0.30, abs=1e-6)
            month = (await client.call("box", "costs.get", {}))["month"]
            assert entry["kwh"] < month["kwh"]  # the host's idle draw is not the job's
            await client.call("box", "jobs.stop", {"id": job["id"]})


TWO_MACHINES = {
    **LAB,
    "machines": [
        {
            "name": "box",
            "idle_watts": 100,
            "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75, "profile": "training"}]},
        },
        {
            "name": "rented",
            "hourly_rate": 2.5,
            "gpus": {"seed": 3, "sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75, "profile": "bursty"}]},
        },
    ],
}


@pytest.mark.timeout(90)
async def test_header_counter_and_costs_view(tmp_path, lab_file):
    with DemoLab(tmp_path / "run", source=lab_file(TWO_MACHINES)) as demo:
        app = CetlabApp(load_lab(demo.lab_path))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(lambda: all(v.online and v.costs for v in app.state.machines.values()), timeout=30)

            def rate() -> float:
                text = header(app)
                return float(text.split(" EUR/h")[0].split()[-1]) if " EUR/h · today" in text else 0.0

            await wait_for(lambda: rate() > 2.5, timeout=10)  # the rented machine's 2.50 an hour plus the owned one's power
            assert rate() < 2.5 + 0.3 and "SIM power" in header(app)

            await pilot.press("colon", *"costs", "enter")
            await wait_for(lambda: isinstance(app.screen, CostsScreen) and app.screen.report is not None, timeout=20)
            screen = app.screen
            table = screen.query_one("#costs-by")
            await wait_for(lambda: table.row_count == 2, timeout=10)
            assert {table.get_row(k)[0] for k in table.rows} == {"box", "rented"}
            summary = str(screen.query_one("#costs-summary").render())
            assert "this month" in summary and "saving" in summary and "SIM" in summary
            assert (
                "over the last 30 days, since " in summary and "(as `cetlab costs --since " in summary
            )  # the window, as the CLI asks it
            await wait_for(lambda: screen._plotted and screen._plotted[-1][1] > 0, timeout=15)  # today's spend is on the plot
            # the header's live counter is the one: the view's first line is the month, not the header again
            assert "EUR/h" in header(app) and not screen.query("#costs-counter")
            assert summary.startswith("this month")

            await pilot.press("b")  # by job: none runs here
            await wait_for(lambda: screen.report is not None and screen.report.by_kind == "job", timeout=10)
            assert table.row_count == 0
