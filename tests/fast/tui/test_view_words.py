"""The words and cells of the views: phases said once, steps, the start form's bounds, the header under a modal,
plots."""

from __future__ import annotations

import time

import pytest

from agents.wire.catalogue.jobs import RecipeInfo
from console.tui.screens.modals import StartJobScreen

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- 11: cut and odd text


def test_a_phase_that_repeats_the_state_is_said_once():
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import state_text
    from widgets.orchestra_table import COLUMNS, state_cell

    loading = {"name": "m", "machine": "box", "engine": "sim", "state": "loading", "since": 0.0}
    assert state_text(ModelInfo(**loading, progress={"phase": "loading"})) == "loading"
    assert state_text(ModelInfo(**loading, progress={"phase": "warm-up"})) == "loading (warm-up)"
    assert str(state_cell(ModelInfo(**loading, progress={"phase": "loading"}))) == "loading"
    tiny = str(state_cell(ModelInfo(**loading, progress={"phase": "making the tiny model"})))
    assert tiny == "loading making the tiny model"
    from widgets.live_table import LiveTable
    from widgets.orchestra_table import DROP, STATE_MIN

    table = LiveTable(COLUMNS, lambda item: item, DROP, rest_min=STATE_MIN)  # STATE is the column for the rest
    state_width = 158 - sum((COLUMNS[i][2] or 0) + 2 for i in table.columns_for(158)) - 1
    assert len(tiny) <= state_width, state_width


def test_the_step_cell_keeps_its_percent():
    from agents.wire.sections.jobs import JobInfo
    from tests.support.console import frozen_jobs
    from widgets.jobs_table import COLUMNS, step_cell

    width = dict((k, w) for k, _, w in COLUMNS)["step"]
    for step, max_steps in ((2000, 2000), (1230, 100000)):
        job = JobInfo(**{**frozen_jobs()[0], "step": step, "max_steps": max_steps})
        assert step_cell(job).endswith("%") and len(step_cell(job)) <= width, step_cell(job)


def test_the_start_forms_bounds_are_written_as_numbers_people_write():
    from agents.wire.catalogue.jobs import RecipeParam
    from console.tui.screens.modals import param_hint

    hint = param_hint(RecipeParam(name="max_steps", type="int", min=1.0, max=100000.0, flag="--max-steps"))
    assert "(int, 1..100000)" in hint, hint
    assert "(float, ..0.5)" in param_hint(RecipeParam(name="lr", type="float", min=None, max=0.5, flag="--lr"))


def test_one_checkpoint_is_singular_and_a_model_is_named_once_in_costs():
    from agents.wire.catalogue.checkpoints import Pruned
    from agents.wire.catalogue.costs import PricedGroup
    from agents.wire.sections.checkpoints import CheckpointInfo
    from console.cli.checkpoints import prune_human
    from console.tui.screens.costs import breakdown_rows

    one = CheckpointInfo(run="r", step=1, path="r/checkpoint-1")
    assert "deleted 1 checkpoint," in prune_human(Pruned(run="r", keep_last=0, deleted=[one], freed_bytes=10))
    entry = {
        "model": "llama-3.1-8b",
        "label": "llama-3.1-8b",
        "machine": "m5",
        "kwh": 1.0,
        "cost": 0.3,
        "cloud_equivalent": 2.0,
        "saving_pct": 85.0,
        "gpu_hours": 1.0,
        "gpu_busy_hours": 0.5,
        "tokens": 1000,
    }
    rows = breakdown_rows([PricedGroup.model_validate(entry)], "model", "EUR")
    assert rows["m5/llama-3.1-8b"][0] == "llama-3.1-8b @m5"


def test_the_start_forms_bounds_keep_exponents_and_minus_signs():
    """The N/A marker is "-": removing it ate 1e-06's sign and a negative minimum's ("(float, 1e06..1)")."""
    from agents.wire.catalogue.jobs import RecipeParam
    from console.tui.screens.modals import param_hint

    assert "(float, 1e-06..1)" in param_hint(
        RecipeParam(name="learning_rate", type="float", min=1e-6, max=1.0, flag="--learning-rate")
    )
    assert "(float, -2.5..)" in param_hint(RecipeParam(name="bias", type="float", min=-2.5, max=None, flag="--bias"))


async def test_the_header_clock_and_cost_go_on_while_a_modal_is_open():
    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.modals import HelpScreen
    from tests.support.console import FROZEN_NOW, frozen_state
    from tests.support.waits import until_drawn, wait_for
    from widgets.lab_header import LabHeader

    now = [FROZEN_NOW]
    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: now[0])
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        view = app.screen
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        before = str(view.query_one(LabHeader).text)
        now[0] += 75  # 1 min 15 s later, the help still open
        clock = time.strftime("%H:%M:%S", time.localtime(now[0]))
        shown = await wait_for(
            lambda: clock in str(view.query_one(LabHeader).text) and str(view.query_one(LabHeader).text), timeout=10
        )
        assert shown != before and isinstance(app.screen, HelpScreen)


def test_the_costs_plot_spans_its_days_and_names_its_window():
    """A one-day lab drew two bars as wide as the plot; the view said "since 2026-10-26" where the CLI says the month's 1st."""
    from datetime import date

    from console.lab.costs import LabDay
    from console.tui.screens.costs import PLOT_DAYS, plot_days

    today = date(2026, 11, 24)
    days = plot_days([LabDay(day="2026-11-24", api=0.0, cost=1.5, cloud_equivalent=9.0, kwh=None)], date(2026, 10, 26), today)
    assert len(days) == PLOT_DAYS and days[-1] == ("11-24", 1.5, 9.0) and days[0] == ("10-26", 0.0, 0.0)
    assert all(cost == cloud == 0.0 for _, cost, cloud in days[:-1])
    assert plot_days([], today, today) == [("11-24", 0.0, 0.0)]


async def test_the_jump_placeholder_names_every_view_and_help_wraps_in_its_column():
    """The `:` placeholder was cut before audit and gateway; `?` wrapped a long description back to column 0."""
    from rich.console import Console
    from textual.widgets import Input, Static

    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.modals import HelpScreen, JumpScreen
    from console.tui.views import VIEWS
    from tests.support.console import FROZEN_NOW, frozen_state
    from tests.support.waits import until_drawn, wait_for

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon")
        jump = await wait_for(lambda: isinstance(app.screen, JumpScreen) and app.screen)
        await pilot.pause()
        field = jump.query_one("#jump", Input)
        assert field.content_size.width >= len(field.placeholder) and all(name in field.placeholder for name in VIEWS)
        await pilot.press("escape")
        long = "resume a run from the selected checkpoint with the params it ran with, each of them changeable before it starts"
        app.push_screen(HelpScreen([("r", long)]))
        help_screen = await wait_for(lambda: isinstance(app.screen, HelpScreen) and app.screen)
        await pilot.pause()
        console = Console(width=help_screen.query_one(Static).content_size.width, record=True, color_system=None)
        console.print(help_screen.query_one(Static).content)
        lines = console.export_text().splitlines()
        first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("r "))
        assert lines[first + 1].startswith(" " * 12) and lines[first + 1].strip(), lines[first : first + 3]


async def test_the_machine_detail_gives_its_charts_the_rows_it_has():
    """Two-row charts on a 50-row screen before: the GPU panels now share the view's height."""
    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.machine import MachineScreen
    from tests.support.console import FROZEN_NOW, frozen_state
    from tests.support.waits import until_drawn, wait_for
    from widgets.gpu_panel import GpuPanel

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        app.push_screen(MachineScreen("irina"))  # two GPUs
        screen = await wait_for(
            lambda: isinstance(app.screen, MachineScreen) and len(app.screen.query(GpuPanel)) == 2 and app.screen
        )
        await pilot.pause()
        heights = [chart.size.height for chart in screen.query("ScaleChart")]
        assert heights and min(heights) >= 6, heights


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_checkpoints_on_a_small_screen_show_rows_and_the_selected_step(frozen_app, size):
    """At 80x24 :checkpoints showed one table row, not the selected step, and a stray scrollbar mark on an empty row."""
    from agents.wire.catalogue.checkpoints import RunCheckpoints
    from console.tui.screens.checkpoints import CheckpointsScreen
    from tests.support.checkpoints_view import frozen_run
    from tests.support.screen_text import screen_lines
    from tests.support.waits import until_drawn

    app = frozen_app
    async with app.run_test(size=size) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        await until_drawn(pilot, CheckpointsScreen)
        app.screen.show_detail(RunCheckpoints.model_validate(frozen_run()[1]))
        await pilot.pause()
        lines = screen_lines(app)
        top = next(i for i, line in enumerate(lines) if line.startswith(" STEP"))
        rows = lines[top + 1 : next(i for i in range(top, len(lines)) if lines[i].startswith("───"))]
        steps = [row.split()[0] for row in rows if row.strip() and row.split()[0].isdigit()]
        assert len(steps) >= 5 and "250" in steps, lines  # the best is selected: it is on screen
        assert not any(set(row.strip()) <= {"▏", "▕", "▎", "▍"} and row.strip() for row in rows), rows
        assert "BEST" in next(row for row in rows if row.split() and row.split()[0] == "250")


async def test_the_alerts_route_block_shows_its_last_line_at_120x40(frozen_app):
    """Four routes of the demo's kind wrap at 120 columns: a block of at most 8 lines hid the last one."""
    from agents.wire.sections.notify import RouteStatus
    from console.tui.screens.alerts import AlertsScreen
    from tests.support.screen_text import screen_lines
    from tests.support.waits import until_drawn

    app = frozen_app
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"alerts", "enter")
        await until_drawn(pilot, AlertsScreen)
        screen = app.screen
        screen.routes = [
            (
                machine,
                RouteStatus(
                    name=f"team-chat-{i}",
                    kind="webhook",
                    format="slack",
                    simulated=True,
                    target=f"file console/team-chat.url of a lab kept in a long folder name number {i}",
                    delivered=3,
                    failures=1,
                    problem="the url file is readable by others" if i == 3 else None,
                ),
            )
            for i, machine in enumerate(["m5", "irina", "workstation", "pharaoh"])
        ]
        screen.refresh_data()
        await pilot.pause()
        said = " ".join(line.strip() for line in screen_lines(app))
        assert all(f"team-chat-{i} SIM" in said for i in range(4)) and "readable by others" in said, said
        assert said.count("3 delivered") == 4, said  # every route's line whole, the last one too


async def test_the_job_forms_help_is_whole_at_120_columns(frozen_app):
    from agents.wire.catalogue.jobs import RecipeParam
    from tests.support.screen_text import screen_lines
    from tests.support.waits import until_drawn, wait_for

    help_text = "a checkpoint-<step> folder to continue from; its optimizer state and step count come along, the data order too"
    recipe = RecipeInfo(
        name="demo-lora",
        machine="m5",
        gpus=[0],
        output_dir="o",
        params=[RecipeParam(name="resume_from_checkpoint", type="str", help=help_text, flag="--resume-from-checkpoint")],
    )
    app = frozen_app
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        app.push_screen(StartJobScreen(recipe))
        await wait_for(lambda: isinstance(app.screen, StartJobScreen) and app.screen.query("#start-error"))
        await pilot.pause()
        await pilot.pause()
        form = [line[line.index("█") + 1 : line.rindex("█")] for line in screen_lines(app) if line.count("█") >= 2]  # its border
        said = " ".join(" ".join(form).split())
        assert help_text in said, said
