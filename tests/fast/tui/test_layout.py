"""Cut and odd text in the console (issue 13 items 11, 12): the costs table and chart each in their own space, integer
step ticks on a loss plot, one VRAM figure in the console and the CLI."""

from __future__ import annotations

from datetime import date

import pytest
from textual.app import App

from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.checkpoints import CheckpointInfo
from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.costs import CostsScreen
from console.tui.screens.fleet import FleetScreen
from tests.support.console import FROZEN_NOW, frozen_state
from tests.support.screen_text import screen_lines
from tests.support.waits import until_drawn, wait_for
from widgets.checkpoint_timeline import CheckpointTimeline, step_ticks


def priced(cost: float, kwh: float = 1.25) -> dict:
    return {"cost": cost, "cloud_equivalent": cost * 9, "kwh": kwh, "missing": []}


def costs_report(machine: str, tokens: int) -> dict:
    """One machine's `costs.get` answer, by machine, as the agent shapes it."""
    today = date.today().isoformat()
    entry = {
        "machine": machine,
        "label": "",
        "kwh": 12.345,
        "energy_cost": 3.2,
        "rent": 0.0,
        "cost": 3.2,
        "uptime_s": 86400.0,
        "gpu_hours": 24.0,
        "gpu_busy_hours": 7.5,
        "tokens": tokens,
        "cloud_gpu": 20.0,
        "cloud_tokens": 0.383,
        "cloud_equivalent": 20.383,
        "saving": 17.18,
        "saving_pct": 84.3,
        "missing": [],
    }
    return {
        "machine": machine,
        "currency": "USD",
        "timezone": "UTC",
        "rented": False,
        "now": {"power_w": 300.0, "per_hour": 0.09, "missing": []},
        "today": priced(0.383),
        "month": priced(3.2),
        "since": {"day": today, **priced(3.2)},
        "by": [entry],
        "days": [{"day": today, **priced(0.383)}],
        "simulated": True,
        "api_providers": [],
        "api_today": 0.0,
        "api_month": 0.0,
        "api_since": 0.0,
        "total_month": 3.2,
    }


@pytest.mark.parametrize("size", [(160, 50), (100, 30), (80, 24)])
async def test_the_costs_table_and_chart_each_have_their_own_space(size):
    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)

    async def call(machine, method, params=None, timeout=None):
        if machine not in ("m5", "irina"):
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine} is offline")
        return costs_report(machine, 153_783)

    async with app.run_test(size=size) as pilot:
        app.client.call = call
        await until_drawn(pilot, FleetScreen)
        await pilot.press("colon", *"costs", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, CostsScreen) and app.screen.report is not None and app.screen)
        table = screen.query_one("#costs-by")
        await wait_for(lambda: table.row_count == 2)
        await pilot.pause()
        plot = screen.query_one("#costs-plot")
        assert not table.region.overlaps(plot.region) and plot.region.height >= 8
        assert table.virtual_size.width <= table.scrollable_content_region.width  # every column it shows fits: none cut
        assert [str(c.label) for c in table.ordered_columns][-1] == "tokens"
        lines = screen_lines(app)
        row = next(line for line in lines if "153,783" in line)
        assert "┤" not in row, row  # the chart's axis is on lines of its own


def test_step_ticks_are_whole_steps():
    assert step_ticks(1, 8) == [2, 4, 6, 8]
    assert step_ticks(0, 3) == [0, 1, 2, 3]
    assert step_ticks(5, 5) == [5]
    assert step_ticks(0, 2000) == [0, 500, 1000, 1500, 2000]
    assert all(isinstance(t, int) for t in step_ticks(0, 7))


async def test_a_short_runs_loss_plot_shows_whole_steps_on_its_x_axis():
    class Plot(App):
        def compose(self):
            yield CheckpointTimeline(id="timeline")

    app = Plot()
    async with app.run_test(size=(100, 20)) as pilot:
        timeline = app.query_one(CheckpointTimeline)
        loss = [(step, 2.0 - step / 10) for step in range(1, 9)]
        checkpoints = [
            CheckpointInfo(run="exp1", step=step, path=f"exp1/checkpoint-{step}", loss=value)
            for step, value in ((4, 1.6), (8, 1.2))
        ]
        timeline.show("run exp1", loss, [], checkpoints, selected=8)
        await pilot.pause()
        lines = screen_lines(app)
        axis = next(line for line in reversed(lines) if "step" not in line and any(c.isdigit() for c in line))
        labels = axis.split()
        assert labels and all("." not in label for label in labels), axis
        assert {"2", "4", "6", "8"} <= set(labels), axis


def test_a_models_vram_reads_the_same_in_the_console_and_the_cli():
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import models_human
    from tests.support.console import frozen_models
    from widgets.orchestra_table import COLUMNS, model_cells

    models = [m for section in frozen_models().values() for m in section["models"]]
    measured = {**models[-1], "name": "tiny-hf-gpu", "gpus": [0], "vram_bytes": int(1.3 * 1024**3), "vram_measured": True}
    models.append(measured)  # a transformers model on a GPU, its VRAM measured by NVML
    lines = models_human([ModelInfo(**m) for m in models], {}, {}).splitlines()
    vram_at = lines[0].index("VRAM")
    vram_column = [key for key, _, _ in COLUMNS].index("vram")
    for model, line in zip(models, lines[1:]):
        cli = line[vram_at:].split()[0]
        console = str(model_cells(ModelInfo(**model))[vram_column])
        assert cli == console, (model["name"], cli, console)
    assert str(model_cells(ModelInfo(**measured))[vram_column]) == "1.3G"
