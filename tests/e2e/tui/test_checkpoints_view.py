"""The Checkpoints view: Pilot against real agents and real checkpoints; a snapshot of a deterministic run."""

from __future__ import annotations

import pytest

from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.checkpoints import CheckpointsScreen
from console.tui.screens.modals import AskNumberScreen, ConfirmScreen
from tests.support.waits import wait_for
from widgets.checkpoint_timeline import CheckpointTimeline

SIZE = (160, 50)


pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def lab(checkpoints_lab):
    """Real checkpoints (tests/conftest.py), one agent, for this module."""
    return checkpoints_lab


def complete_steps(run) -> list[int]:
    """The steps of the run's complete checkpoints still on disk (9 and up are the broken ones)."""
    return sorted(s for s in (int(p.name.split("-")[1]) for p in run.glob("checkpoint-*")) if s <= 8)


def table_steps(app) -> list[int]:
    return [int(key) for key in app.screen.query_one("#ckpt-table").items]


async def test_view_shows_a_run_and_acts_on_its_checkpoints(lab, hand_runs):
    app = CetlabApp(load_lab(lab.lab_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"checkpoints", "enter")
        screen = app.screen
        assert isinstance(screen, CheckpointsScreen)
        await wait_for(lambda: screen.runs(), 30)
        screen.show_run("box", "exp3")
        await wait_for(lambda: table_steps(app)[:1] == [1] and screen.detail and screen.detail.run == "exp3", 30)
        assert "exp3" in str(screen.query_one("#ckpt-run").render())
        timeline = screen.query_one(CheckpointTimeline)
        assert timeline.shown_curve  # the loss curve is drawn
        best = next(c.step for c in screen.detail.checkpoints if c.is_best)
        assert screen.selected().step == best  # the cursor starts on the best one
        assert "step" in str(screen.query_one("#ckpt-detail").render())

        # k moves up (as in every view); p keeps the selected checkpoint; the table says so once the agent answered
        await pilot.press("k", "j")
        assert screen.selected().step == best and app.screen is screen
        await pilot.press("p")
        await wait_for(lambda: next(c for c in screen.detail.checkpoints if c.step == best).kept, 30)
        assert (hand_runs / "exp3" / f"checkpoint-{best}").is_dir()

        # ctrl+d on the best asks twice; n at the second question leaves it on disk
        await pilot.press("ctrl+d")
        first = await wait_for(lambda: isinstance(app.screen, ConfirmScreen) and app.screen)
        await pilot.press("y")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen) and app.screen is not first)
        await pilot.press("n")
        await wait_for(lambda: app.screen is screen)
        assert (hand_runs / "exp3" / f"checkpoint-{best}").is_dir()

        # P asks for N, confirms, and the agent prunes: best + last 1 + kept remain
        await pilot.press("P")
        await wait_for(lambda: isinstance(app.screen, AskNumberScreen))
        await pilot.press("backspace", "1", "enter")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(lambda: len(complete_steps(hand_runs / "exp3")) < 8, 30)
        left = complete_steps(hand_runs / "exp3")
        assert left == sorted({best, 8})  # the best (also kept) and the newest
        await wait_for(lambda: set(table_steps(app)) == set(left) | {9, 10, 11}, 30)  # incomplete ones stay, listed


async def test_c_on_a_job_opens_its_runs_checkpoints(lab):
    app = CetlabApp(load_lab(lab.lab_path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.state.machines["box"].online, 30)
        job = await app.client.call("box", "jobs.start", {"recipe": "tiny", "params": {"max_steps": 2, "save_steps": 2}})
        await pilot.press("colon", *"jobs", "enter")
        await wait_for(lambda: any(j.id == job["id"] and j.state == "exited" for j in app.state.machines["box"].jobs), 120)
        await wait_for(lambda: job["id"] in app.screen.query_one("#jobs-table").items)
        app.screen.query_one("#jobs-table").select_key(job["id"])
        await pilot.press("c")
        await wait_for(lambda: isinstance(app.screen, CheckpointsScreen))
        assert app.screen.run_key == ("box", job["id"])
        await wait_for(lambda: table_steps(app) == [2], 30)
        assert app.screen.detail.job == job["id"] and app.screen.detail.recipe == "tiny"


async def test_readonly_console_does_not_bind_the_verbs(lab):
    app = CetlabApp(load_lab(lab.lab_path), readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("colon", *"checkpoints", "enter")
        screen = app.screen
        await wait_for(lambda: screen.runs(), 30)
        screen.show_run("box", "exp1")
        await wait_for(lambda: table_steps(app), 30)
        assert not {"ctrl+d", "P", "r", "v", "p"} & set(screen.active_bindings)
        await pilot.press("ctrl+d", "P", "r", "v", "p")
        await pilot.pause()
        assert app.screen is screen  # no modal: nothing may act
        assert (await app.client.call("box", "checkpoints.list", {"run": "exp1"}))["count"] >= 8
