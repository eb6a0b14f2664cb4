"""The Jobs and log views against real agents: start a recipe from the form, watch it, search its log, stop it."""

from __future__ import annotations

import sys

import pytest
from textual.widgets import Input

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.jobs import JobsScreen
from console.tui.screens.logs import LogScreen
from console.tui.screens.modals import ConfirmScreen, PickRecipeScreen, StartJobScreen
from tests.support.waits import until_drawn, wait_for
from widgets.jobs_table import JobsTable

pytestmark = pytest.mark.timeout(120)


# A trainer that speaks the progress protocol for real, without torch: falling loss, one line per step.
FAKE_TRAINER = """
import os, sys, time
from agents.train.progress import ENV_VAR, write_progress
steps = int(sys.argv[sys.argv.index('--steps') + 1])
for step in range(1, steps + 1):
    print(f'step {step} loss {5 / step:.3f}', flush=True)
    write_progress(os.environ[ENV_VAR], {'state': 'running', 'step': step, 'max_steps': steps, 'loss': 5 / step,
                                         'samples_per_s': 42.0, 'eta_s': (steps - step) * 0.2})
    time.sleep(0.2)  # a step's work: the console watches a run that takes a while
write_progress(os.environ[ENV_VAR], {'state': 'finished', 'step': steps, 'max_steps': steps, 'loss': 5 / steps, 'eta_s': 0})
"""


@pytest.fixture
def lab(tmp_path, lab_file):
    data = {
        "lab": "jobs-console",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250}] * 2}}],
        "alerts": {"starved_util_pct": 50, "starved_for_s": 1},
        "trainers": [
            {
                "name": "fake",
                "machine": "box",
                "gpus": [0],
                "command": [sys.executable, "-c", FAKE_TRAINER],
                "output_dir": "runs/{job_id}",
                "params": [{"name": "steps", "type": "int", "default": 200, "min": 1, "max": 1000, "help": "how long"}],
            },
            {
                "name": "idle",
                "machine": "box",
                "gpus": [1],
                "command": [sys.executable, "-c", "import time; time.sleep(120)"],
                "output_dir": "runs/{job_id}",
                "stop_grace_s": 1,
            },
        ],
    }
    with DemoLab(tmp_path / "run", source=lab_file(data)) as demo:
        yield load_lab(demo.lab_path)
        for job in (demo.dir / "agents" / "box" / "jobs").glob("*"):  # nothing outlives the test
            _kill_job(job)


def _kill_job(job_dir) -> None:
    import os
    import signal

    from agents.jobs.component import _alive
    from agents.jobs.runner import read_json

    child = read_json(job_dir / "child.json") or {}
    if child.get("pid") and _alive(child["pid"], child.get("create_time")):
        os.killpg(child["pid"], signal.SIGKILL)


def job_of(app: CetlabApp, job_id: str) -> dict:
    """The job as the console's LabState has it, as a dict ({} before it arrives)."""
    return next((j.model_dump() for j in app.state.machines["box"].jobs if j.id == job_id), {})


def cell(app: CetlabApp, job_id: str, column: str) -> str:
    return str(app.screen.query_one(JobsTable).get_cell(job_id, column))


async def until_screen(pilot, app: CetlabApp, kind: type, timeout: float = 15.0):
    """The screen of this kind, once it is the one shown."""
    return await wait_for(lambda: isinstance(app.screen, kind) and app.screen, timeout)


async def test_start_watch_search_and_stop_a_run_from_the_jobs_view(lab):
    app = CetlabApp(lab)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(lambda: app.state.machines["box"].online, timeout=30)
        await pilot.press("colon", *"jobs", "enter")
        screen = await until_screen(pilot, app, JobsScreen)
        assert "n starts a recipe" in str(screen.query_one("#jobs-detail").render())

        # n: pick the recipe, then its form
        await pilot.press("n")
        await until_screen(pilot, app, PickRecipeScreen)
        await pilot.press("enter")  # the first recipe: fake
        form = await until_screen(pilot, app, StartJobScreen)
        steps = form.query_one("#param-steps", Input)
        assert steps.value == "200"
        # the agent's verdict on a bad value stays on the form
        steps.value = "0"
        await pilot.press("enter")
        await wait_for(lambda: "below the minimum" in str(form.query_one("#start-error").render()), timeout=10)
        assert isinstance(app.screen, StartJobScreen)
        steps.value = "300"  # a minute: it still runs when the test stops it
        await pilot.press("enter")
        await until_screen(pilot, app, JobsScreen)
        await wait_for(lambda: (job_of(app, "box-1").get("step") or 0) >= 5, timeout=30)
        await until_drawn(pilot, JobsScreen)
        assert cell(app, "box-1", "state").startswith("running")
        assert "/300" in cell(app, "box-1", "step") and "SIM" in cell(app, "box-1", "gpus")
        loss = cell(app, "box-1", "loss")
        assert any(c in loss for c in "▁▂▃▄▅▆▇█")  # the sparkline
        assert cell(app, "box-1", "speed") == "42.0"

        # l: the log, followed live; / searches it
        await pilot.press("l")
        logs = await until_screen(pilot, app, LogScreen)
        await wait_for(lambda: len(logs.lines) >= 8, timeout=20)
        await pilot.press("slash", *"step 3 ", "enter")
        assert logs.match_at is not None and logs.lines[logs.match_at].startswith("step 3 loss")
        assert not logs.following  # a match holds the view still
        grown = len(logs.lines)
        await wait_for(lambda: len(logs.lines) > grown, timeout=10)  # still fetching meanwhile
        await pilot.press("f")
        assert logs.following
        await pilot.press("escape")
        await until_screen(pilot, app, JobsScreen)

        # k moves, as in every view; the kill is ctrl+k, and it asks first
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, JobsScreen)
        await pilot.press("ctrl+k")
        confirm = await until_screen(pilot, app, ConfirmScreen)
        assert "Kill job" in str(confirm.query_one("#confirm-question").render())
        await pilot.press("n")
        await until_screen(pilot, app, JobsScreen)

        # s: asks first; n leaves it running; y stops it
        await pilot.press("s")
        await until_screen(pilot, app, ConfirmScreen)
        await pilot.press("n")
        await until_screen(pilot, app, JobsScreen)
        assert job_of(app, "box-1")["state"] == "running"
        await pilot.press("s")
        await until_screen(pilot, app, ConfirmScreen)
        await pilot.press("y")
        await wait_for(lambda: job_of(app, "box-1").get("state") == "exited", timeout=30)
        await until_drawn(pilot, JobsScreen)
        assert cell(app, "box-1", "state") == "exited(-15)"


async def test_a_starved_run_is_flagged_and_a_readonly_console_cannot_act(lab):
    app = CetlabApp(lab, readonly=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(lambda: app.state.machines["box"].online, timeout=30)
        await pilot.press("colon", *"jobs", "enter")
        screen = await until_screen(pilot, app, JobsScreen)
        # a console that may not act does not bind the acting keys: no footer hint, no help line, no effect
        assert not {"n", "s", "ctrl+k"} & set(screen.active_bindings)
        assert "l" in screen.active_bindings and "j" in screen.active_bindings
        assert [desc for _, desc in screen.visible_bindings()] == ["Logs", "Checkpoints"]
        job = await app.client.call("box", "jobs.start", {"recipe": "idle"})
        await wait_for(lambda: job_of(app, job["id"]).get("starved"), timeout=30)
        await until_drawn(pilot, JobsScreen)
        said: list[str] = []
        app.notify = lambda message, **_: said.append(message)  # what the console tells the operator
        await pilot.press("n", "s", "ctrl+k")
        await pilot.pause()
        assert isinstance(app.screen, JobsScreen) and said == []  # nothing opened, nothing refused after the press
        assert "GPU starved" in cell(app, job["id"], "state")
        assert "GPU starved" in str(app.screen.query_one("#jobs-detail").render())
        await app.client.call("box", "jobs.kill", {"id": job["id"]})
        await wait_for(lambda: job_of(app, job["id"]).get("state") == "exited", timeout=30)


async def test_a_readonly_consoles_job_form_refuses_to_start(lab):
    """The form calls the agent itself: however it is reached (a served console is read-only), it starts nothing."""
    from textual.widgets import Static

    from agents.wire.catalogue.jobs import JOBS_RECIPES
    from agents.wire.catalogue.method import request

    app = CetlabApp(lab, readonly=True)
    async with app.run_test(size=(160, 50)):
        await wait_for(lambda: app.state.machines["box"].online, timeout=30)
        recipe = next(r for r in (await request(app.client, "box", JOBS_RECIPES)).root if r.name == "idle")
        form = StartJobScreen(recipe)
        app.push_screen(form)
        await wait_for(lambda: form.is_mounted)
        form.start()
        await wait_for(lambda: "read-only console" in str(form.query_one("#start-error", Static).render()))
        assert app.screen is form  # not dismissed with a job


def test_snapshot_jobs(snap_compare, monkeypatch):
    import time

    from console.lab.client import FleetClient
    from tests.support.console import FROZEN_NOW, frozen_jobs, frozen_state

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    state = frozen_state()
    state.machines["m5"].apply_section("jobs", frozen_jobs())
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)

    async def open_view(pilot):
        await until_drawn(pilot)
        await pilot.press("colon", *"jobs", "enter")
        await until_drawn(pilot, JobsScreen)
        await pilot.press("j", "j")  # the crash: its error and last lines below the table
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=(160, 50), run_before=open_view)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


async def test_precision_shows_in_the_table_and_notes_in_the_details(monkeypatch):
    from console.lab.client import FleetClient
    from tests.support.console import FROZEN_NOW, frozen_jobs, frozen_state

    jobs = frozen_jobs()
    jobs[0].update(precision="fp16", notes=["bf16 off: the P4 has no bf16 (compute capability 6.1)"])
    state = frozen_state()
    state.machines["m5"].apply_section("jobs", jobs)
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"jobs", "enter")
        await until_drawn(pilot, JobsScreen)
        assert cell(app, "m5-4", "precision") == "fp16" and cell(app, "m5-3", "precision") == "-"
        detail = str(app.screen.query_one("#jobs-detail").render())
        assert "precision fp16" in detail and "note: bf16 off: the P4 has no bf16" in detail, detail


async def test_clearing_a_param_with_a_default_is_refused_not_run_as_the_default():
    from agents.wire.catalogue.jobs import RecipeInfo
    from console.lab.client import FleetClient
    from tests.support.console import FROZEN_NOW, frozen_state

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    recipe = RecipeInfo.model_validate(
        {
            "name": "demo-lora",
            "machine": "m5",
            "gpus": [0],
            "launcher": "local",
            "output_dir": "runs/{job_id}",
            "params": [
                {"name": "max_steps", "type": "int", "default": 2000, "min": 1, "max": 100000, "flag": "--max-steps", "help": ""}
            ],
        }
    )
    calls = []
    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = lambda *args, **kwargs: calls.append(args)
        await until_drawn(pilot)
        app.push_screen(StartJobScreen(recipe))
        form = await until_screen(pilot, app, StartJobScreen)
        field = await wait_for(lambda: form.query("#param-max_steps").first() if form.query("#param-max_steps") else None)
        field.value = ""
        await pilot.press("ctrl+s")
        error = form.query_one("#start-error")
        await wait_for(lambda: "max_steps is empty: it would run with its default 2000" in str(error.render()))
        assert app.screen is form and calls == []
