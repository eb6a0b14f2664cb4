"""The Orchestra view against real agents: keys warm, sleep, swap, pin and stop models; modals confirm."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.modals import ConfirmScreen, PickModelScreen
from console.tui.screens.models import ModelsScreen
from tests.support.pool import pool_lab, sim_model
from tests.support.waits import until_drawn, wait_for
from widgets.orchestra_table import OrchestraTable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pool(tmp_path, lab_file):
    data = pool_lab([sim_model("a", [0], 18), sim_model("b", [0], 18), sim_model("c", [1], 4)], orchestra={"warm": ["a"]})
    with DemoLab(tmp_path / "run", source=lab_file(data)) as demo:
        yield load_lab(demo.lab_path)


def model_state(app: CetlabApp, name: str) -> dict:
    return next((m.model_dump() for m in app.state.machines["box"].model_list if m.name == name), {"state": None, "op": None})


async def until(app: CetlabApp, name: str, state: str, timeout: float = 30.0) -> dict:
    """The model once it has settled in this state (no operation in flight)."""

    def settled() -> dict | None:
        model = model_state(app, name)
        return model if model["state"] == state and not model.get("op") else None

    settled.__name__ = f"{name} settled {state}"
    return await wait_for(settled, timeout)


def cell(app: CetlabApp, name: str, column: str) -> str:
    return str(app.screen.query_one(OrchestraTable).get_cell(f"box/{name}", column))


async def test_models_view_keys_drive_the_pool(pool):
    app = CetlabApp(pool)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("colon", *"models", "enter")
        await wait_for(lambda: isinstance(app.screen, ModelsScreen))
        await until(app, "a", "warm")
        await until_drawn(pilot, ModelsScreen)
        assert cell(app, "a", "state").startswith("warm") and "SIM" in cell(app, "a", "engine")
        assert cell(app, "b", "state") in ("cold", "cached")

        # s asks first; n leaves the model serving
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, ModelsScreen)
        await pilot.pause()
        assert model_state(app, "a")["state"] == "warm" and not model_state(app, "a").get("op")
        await pilot.press("s")
        await pilot.press("y")
        await until(app, "a", "sleeping")

        # w wakes it (no question: it interrupts nothing)
        await pilot.press("w")
        a = await until(app, "a", "warm")
        assert a["wake_s"] is not None

        # x: pick the model to bring in on a's GPU, confirm, watch it swap
        await pilot.press("x")
        assert isinstance(app.screen, PickModelScreen)
        options = app.screen.query_one(OptionList)
        assert [options.get_option_at_index(i).id for i in range(options.option_count)] == ["b", "c"]
        options.focus()
        options.highlighted = 0
        await pilot.press("enter")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(app, "b", "warm")
        assert model_state(app, "a")["state"] == "sleeping" and model_state(app, "b")["gpus"] == [0]

        # j / k / g / G move; p pins the selected model; c stops it after a question
        table = app.screen.query_one(OrchestraTable)
        await pilot.press("G")
        assert table.selected().name == "c"
        await pilot.press("g", "j")
        assert table.selected().name == "b"
        await pilot.press("j")
        assert table.selected().name == "c"
        await pilot.press("w")
        await until(app, "c", "warm")
        await pilot.press("p")
        await wait_for(lambda: model_state(app, "c").get("pinned") is True)
        await wait_for(lambda: "PIN" in cell(app, "c", "state"))
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(lambda: model_state(app, "c")["state"] in ("cold", "cached"), 30)


async def test_models_view_read_only_acts_on_nothing(pool):
    app = CetlabApp(pool, readonly=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.switch_mode("models")
        await until(app, "a", "warm")
        await until_drawn(pilot, ModelsScreen)
        assert not {"w", "s", "c", "x", "p"} & set(app.screen.active_bindings)  # not bound at all
        await pilot.press("j")  # b, cold
        await pilot.press("w", "x", "s", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen)  # no modal opened
        audit = await app.client.call("box", "audit.list", {})
        assert not [e for e in audit["entries"] if e["method"].startswith("models.")]  # nothing reached the agent
