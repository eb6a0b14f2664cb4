"""The Checkpoints view: Pilot against real agents and real checkpoints; a snapshot of a deterministic run."""

from __future__ import annotations

import time

import pytest

from agents.wire.catalogue.checkpoints import RunCheckpoints
from agents.wire.sections.checkpoints import CheckpointInfo
from console.tui.screens.checkpoints import CheckpointsScreen
from tests.support.checkpoints_view import (
    frozen_run,
)
from tests.support.console import frozen_jobs
from tests.support.waits import until_drawn, wait_for
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
