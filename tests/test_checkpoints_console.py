"""The Checkpoints view: Pilot against real agents and real checkpoints; a snapshot of a deterministic run."""

from __future__ import annotations

import math
import time

import pytest

from agents.wire.catalogue.checkpoints import RunCheckpoints
from agents.wire.lab.model import load_lab
from agents.wire.sections.checkpoints import CheckpointInfo
from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.checkpoints import CheckpointsScreen
from console.tui.screens.modals import AskNumberScreen, ConfirmScreen
from tests.conftest import until_drawn, wait_for
from tests.console_fixtures import FROZEN_NOW, frozen_jobs, frozen_state
from widgets.checkpoint_timeline import CheckpointTimeline, marker_groups

SIZE = (160, 50)

pytestmark = pytest.mark.timeout(180)


def test_markers_sit_on_the_curve_by_kind():
    loss = [[1, 3.0], [2, 2.0], [3, 1.5], [4, 1.0]]
    checkpoints = [
        CheckpointInfo(run="r", path=f"r/checkpoint-{c['step']}", **c)
        for c in (
            {"step": 2, "loss": None, "complete": True},
            {"step": 3, "loss": 1.5, "is_best": True, "complete": True},
            {"step": 4, "loss": 1.0, "kept": True, "complete": True},
            {"step": 5, "complete": False},
        )
    ]
    groups = {label: (steps, ys) for label, _, _, steps, ys in marker_groups(checkpoints, loss, selected=4)}
    assert groups == {"saved": ([2], [2.0]), "incomplete": ([5], [1.0]), "best": ([3], [1.5]), "selected": ([4], [1.0])}


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


# ---------------------------------------------------------------------------- snapshot


def frozen_run() -> tuple[dict, dict]:
    """A 300-step run, loss every 5 steps, eval every 50, a checkpoint every 50 (one half-written)."""
    loss = [[s, round(0.9 + 5.6 * math.exp(-s / 70) + 0.08 * math.sin(s / 7), 4)] for s in range(5, 301, 5)]
    evals = [[s, round(1.1 + 5.0 * math.exp(-s / 80) + (0.15 if s == 300 else 0.0), 4)] for s in range(50, 301, 50)]
    at = dict(loss)
    checkpoints = []
    for i, step in enumerate(range(50, 301, 50)):
        checkpoints.append(
            {
                "run": "m5-3",
                "step": step,
                "epoch": round(step / 12.5, 2),
                "path": f"/runs/m5-3/checkpoint-{step}",
                "written_at": FROZEN_NOW - 60 * (6 - i),
                "size_bytes": 3_400_000 + 1000 * i,
                "loss": at[step],
                "eval_loss": dict(evals)[step],
                "save_s": 0.4 + 0.05 * i,
                "save_s_from": "trainer",
                "is_best": step == 250,
                "kept": step == 100,
                "newest": step == 300,
                "kind": "adapter",
                "has_optimizer": True,
                "complete": True,
                "problem": None,
                "in_use": None,
                "serving": {"model": "m5-3-step250", "mode": "merged", "state": "warm", "error": None} if step == 250 else None,
            }
        )
    checkpoints.append(
        {
            **checkpoints[-1],
            "step": 350,
            "path": "/runs/m5-3/checkpoint-350",
            "loss": None,
            "eval_loss": None,
            "save_s": None,
            "is_best": False,
            "newest": False,
            "kept": False,
            "complete": False,
            "problem": "save in progress (written 1 s ago)",
            "written_at": FROZEN_NOW - 1,
            "serving": None,
        }
    )
    summary = {
        "run": "m5-3",
        "machine": "m5",
        "path": "/runs/m5-3",
        "job": "m5-3",
        "recipe": "demo-lora",
        "job_state": "exited",
        "count": 6,
        "incomplete": 1,
        "newest_step": 300,
        "best_step": 250,
        "best_loss": evals[4][1],
        "disk_bytes": sum(c["size_bytes"] for c in checkpoints),
        "save_s_total": 3.15,
        "wall_s": 412.0,
        "save_share_pct": 0.76,
    }
    return summary, {**summary, "checkpoints": checkpoints, "curves": {"loss": loss, "eval_loss": evals}}


@pytest.fixture
def frozen_app(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    state = frozen_state()
    summary, _ = frozen_run()
    state.machines["m5"].apply_section("checkpoints", [summary])
    yield CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    monkeypatch.delenv("TZ")
    time.tzset()


def test_snapshot_checkpoints(snap_compare, frozen_app):
    async def open_view(pilot):
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        await until_drawn(pilot, CheckpointsScreen)
        pilot.app.screen.show_detail(RunCheckpoints.model_validate(frozen_run()[1]))
        await wait_for(lambda: pilot.app.screen.query_one(CheckpointTimeline).shown_curve)
        await pilot.pause()

    assert snap_compare(frozen_app, terminal_size=SIZE, run_before=open_view)


async def test_the_details_follow_the_row_when_the_served_model_warms(frozen_app):
    app = frozen_app
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, CheckpointsScreen) and app.screen)
        _, detail = frozen_run()
        best = next(c for c in detail["checkpoints"] if c["is_best"])
        best["serving"] = {**best["serving"], "state": "loading"}
        screen.show_detail(RunCheckpoints.model_validate(detail))
        assert screen.selected().step == best["step"]
        best["serving"]["state"] = "warm"
        screen.show_detail(
            RunCheckpoints.model_validate(detail)
        )  # the next listing: the row and the details both say warm, the cursor unmoved
        await pilot.pause()
        assert "(warm)" in str(screen.table().get_cell(str(best["step"]), "flags"))
        assert "merged on model m5-3-step250, warm" in str(screen.query_one("#ckpt-detail").render())


async def test_a_serve_on_its_way_is_fetched_again_until_it_settles(frozen_app, monkeypatch):
    """Merging, then loading: the run's summary and job do not change, the listing must be asked for again (it said merging forever)."""
    app = frozen_app
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, CheckpointsScreen) and app.screen)
        fetched: list[str] = []
        monkeypatch.setattr(screen, "fetch_run", lambda machine, run: fetched.append(run))
        monkeypatch.setattr(app, "connect", True)
        _, detail = frozen_run()
        best = next(c for c in detail["checkpoints"] if c["is_best"])
        for state, again in (("merging", True), ("loading", True), ("warm", False)):
            best["serving"]["state"] = state
            screen.show_detail(RunCheckpoints.model_validate(detail))
            screen._fetched = (screen.summary(), time.monotonic() - 10)  # fetched 10 s ago; the run's job has exited
            fetched.clear()
            screen.refresh_data()
            assert fetched == (["m5-3"] if again else []), state


async def test_in_use_follows_the_job_that_resumed_from_it(frozen_app, monkeypatch):
    """`r` then the resumed job ends: the run's own job and summary are unchanged, the listing said "in use" 13 minutes later."""
    app = frozen_app
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, CheckpointsScreen) and app.screen)
        fetched: list[str] = []
        monkeypatch.setattr(screen, "fetch_run", lambda machine, run: fetched.append(run))
        monkeypatch.setattr(app, "connect", True)
        summary, detail = frozen_run()
        best = next(c for c in detail["checkpoints"] if c["is_best"])
        machine = app.state.machines["m5"]
        for in_use, again in (("job m5-4 resumed from it and is starting", True), (None, True), (None, False)):
            best["in_use"] = in_use
            machine.apply_section("checkpoints", [{**summary, "in_use": [f"step 250: {in_use}"] if in_use else []}])
            screen.refresh_data()
            assert fetched == (["m5-3"] if again else []), in_use
            screen.show_detail(RunCheckpoints.model_validate(detail))
            fetched.clear()
        assert "in use" not in str(screen.query_one("#ckpt-detail").render())


async def test_resume_opens_a_form_with_the_runs_params_to_change(frozen_app, monkeypatch):
    """`r` on a checkpoint: the run's recipe, filled with what the run ran with; max_steps changed as `--set max_steps=240` does."""
    from textual.widgets import Input

    from console.tui.screens.modals import ResumeJobScreen

    app = frozen_app
    recipe = {
        "name": "demo-lora",
        "machine": "m5",
        "gpus": [0],
        "launcher": "local",
        "nproc_per_node": None,
        "command": ["x"],
        "output_dir": "runs/{job_id}",
        "params": [
            {"name": "max_steps", "type": "int", "default": 200, "min": 1, "max": 100000, "flag": "--max-steps", "help": ""},
            {
                "name": "resume_from_checkpoint",
                "type": "str",
                "default": None,
                "min": None,
                "max": None,
                "flag": "--resume-from-checkpoint",
                "help": "",
            },
        ],
    }
    calls: list[tuple[str, str, dict]] = []

    async def call(machine: str, method: str, params: dict | None = None, timeout: float | None = None):
        calls.append((machine, method, params or {}))
        job = frozen_jobs()[0]
        return {
            "jobs.recipes": [recipe],
            "jobs.get": {**job, "id": "m5-3", "params": {"max_steps": 300}},
            "checkpoints.resume": {**job, "id": "m5-9", "resumed_from": frozen_run()[1]["checkpoints"][4]},
        }[method]

    monkeypatch.setattr(app.client, "call", call)
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, CheckpointsScreen) and app.screen)
        screen.show_detail(RunCheckpoints.model_validate(frozen_run()[1]))
        await pilot.pause()
        await pilot.press("r")
        form = await wait_for(lambda: isinstance(app.screen, ResumeJobScreen) and app.screen)
        await pilot.pause()
        field = form.query_one("#param-max_steps", Input)
        assert field.value == "300" and not form.query(
            "#param-resume_from_checkpoint"
        )  # the run's own; the agent fills the checkpoint
        field.value = "240"
        await pilot.press("ctrl+s")
        await wait_for(lambda: isinstance(app.screen, CheckpointsScreen))
        assert ("m5", "checkpoints.resume", {"run": "m5-3", "step": 250, "params": {"max_steps": "240"}}) in calls, calls
