"""A model's replicas in `:models` and `cetlab models`: its placements side by side, which one a key acts on, draining.

The frozen demo lab with one model given a second placement (phi-3-mini on irina beside workstation); no agents behind it: the views
draw the models sections the test sets, and a call to an agent would fail loudly.
"""

from __future__ import annotations

import pytest

from agents.wire.lab.model import Replica
from agents.wire.sections.models import ModelInfo
from console.cli.models import models_human
from console.tui.app import CetlabApp
from console.tui.screens.modals import ConfirmScreen, PickModelScreen
from console.tui.screens.models import ModelsScreen, detail_text
from tests.support.waits import until_drawn
from widgets.orchestra_table import OrchestraTable

pytestmark = pytest.mark.timeout(60)


GIB = 1024**3


def replicated_app() -> CetlabApp:
    from console.lab.client import FleetClient
    from tests.support.console import FROZEN_NOW, frozen_state

    state = frozen_state()
    lab = state.lab
    models = [
        m.model_copy(update={"replicas": [Replica(machine="irina", gpus=[1])]}) if m.name == "phi-3-mini" else m
        for m in lab.models
    ]
    lab = lab.model_copy(update={"models": models})
    base = {"engine": "sim", "since": FROZEN_NOW - 60, "vram_bytes": 4 * GIB, "simulated": True, "state": "warm"}
    workstation = [
        {**base, "name": "phi-3-mini", "machine": "workstation", "gpus": [0], "endpoint": "unix:/run/ws/phi.sock"},
        {**base, "name": "tiny-llama", "machine": "workstation", "gpus": [0], "state": "cold", "vram_bytes": GIB},
    ]
    irina = [
        {
            **base,
            "name": "phi-3-mini",
            "machine": "irina",
            "gpus": [1],
            "endpoint": "unix:/run/irina/phi.sock",
            "draining": True,
            "op": "sleep",
        },
        {**base, "name": "qwen-0.5b", "machine": "irina", "gpus": [1], "state": "cold", "vram_bytes": GIB},  # between them
    ]
    state.machines["workstation"].apply_section("models", {"models": workstation})
    state.machines["irina"].apply_section("models", {"models": irina})
    return CetlabApp(lab, client=FleetClient(lab, state), connect=False, clock=lambda: FROZEN_NOW)


async def test_the_models_view_shows_a_models_replicas_together_and_says_which_one_drains():
    app = replicated_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"models", "enter")
        await until_drawn(pilot, ModelsScreen)
        table = app.screen.query_one(OrchestraTable)
        keys = [str(row.key.value) for row in table.ordered_rows]
        phi = [i for i, key in enumerate(keys) if key.endswith("/phi-3-mini")]
        assert len(phi) == 2 and phi[1] == phi[0] + 1, keys  # side by side
        table.move_cursor(row=table.get_row_index("irina/phi-3-mini"))
        await pilot.pause()
        detail = str(app.screen.query_one("#models-detail").render())
        assert "replica 2 of 2" in detail and "also on workstation" in detail and "draining" in detail, detail

        table.move_cursor(row=table.get_row_index("workstation/phi-3-mini"))
        await pilot.pause()
        await pilot.press("x")  # swap out the replica on workstation: the picker offers workstation's models
        assert isinstance(app.screen, PickModelScreen)
        await pilot.press("enter")
        assert isinstance(app.screen, ConfirmScreen)
        question = str(app.screen.query_one("#confirm-question").render())
        assert "its replica on workstation out (it drains first; the one on irina keeps answering)" in question, question


def test_details_of_a_model_of_one_placement_say_nothing_of_replicas():
    info = ModelInfo(name="solo", machine="box", engine="sim", state="warm", since=0.0)
    assert "replica" not in detail_text(info) and "draining" not in detail_text(info)
    assert "replica 1 of 3" in detail_text(info, ["box", "b", "c"]) and "also on b, c" in detail_text(info, ["box", "b", "c"])


def test_cetlab_models_names_a_model_with_replicas_once_then_a_row_per_placement():
    def info(machine: str, name: str = "chat", **fields) -> ModelInfo:
        return ModelInfo(name=name, machine=machine, engine="sim", state="warm", since=0.0, **fields)

    text = models_human([info("a"), info("b", draining=True), info("a", "solo")], {}, {})
    rows = [line.split()[:3] for line in text.splitlines()[1:4]]
    assert rows == [["chat", "(2", "replicas)"], ["chat", "b", "cpu"], ["solo", "a", "cpu"]], text
    assert "warm (draining)" in text.splitlines()[2]


def test_a_models_replicas_say_its_vram_need_once():
    def info(machine: str) -> ModelInfo:
        return ModelInfo(
            name="chat", machine=machine, engine="sim", state="warm", since=0.0, vram_need_bytes=2 * GIB, vram_source="lab.yaml"
        )

    text = models_human([info("a"), info("b")], {}, {}, fits={"chat": "fits on a GPU 0"})
    needs = [line for line in text.splitlines() if line.startswith("  chat:")]
    assert len(needs) == 1, text
