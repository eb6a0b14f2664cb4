"""The Orchestra view against real agents: keys warm, sleep, swap, pin and stop models; modals confirm."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.tui.app import CetlabApp
from console.tui.screens.modals import ConfirmScreen, PickModelScreen
from console.tui.screens.models import ModelsScreen
from tests.conftest import until_drawn, wait_for
from tests.pool_fixtures import pool_lab, sim_model
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


async def test_the_swap_picker_offers_what_fits_first_and_names_the_true_gpu():
    from console.lab.client import FleetClient
    from tests.console_fixtures import FROZEN_NOW, frozen_state

    gib = 1024**3
    state = frozen_state()
    irina = state.machines["irina"]
    irina.gpus[1] = irina.gpus[1].model_copy(update={"mem_used_bytes": int(6.9 * gib)})  # 1.1 GiB free on GPU 1

    def model(name: str, state_: str, gpus: list[int], vram_gib: float) -> dict:
        return {
            "name": name,
            "machine": "irina",
            "engine": "sim",
            "state": state_,
            "since": FROZEN_NOW - 60,
            "gpus": gpus,
            "vram_bytes": int(vram_gib * gib),
            "simulated": True,
        }

    irina.apply_section(
        "models",
        {
            "models": [
                model("mistral-7b-awq", "warm", [0], 5),
                model("phi-3-mini", "sleeping", [1], 4.5),
                model("tiny-llama", "cold", [0], 2),
                model("qwen-0.5b", "sleeping", [1], 1),
            ]
        },
    )
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"models", "enter")
        await until_drawn(pilot, ModelsScreen)
        table = app.screen.query_one(OrchestraTable)
        table.move_cursor(row=table.get_row_index("irina/mistral-7b-awq"))
        await pilot.press("x")
        assert isinstance(app.screen, PickModelScreen)
        options = app.screen.query_one(OptionList)
        shown = [options.get_option_at_index(i) for i in range(options.option_count)]
        assert [o.id for o in shown] == ["tiny-llama", "qwen-0.5b", "phi-3-mini"]  # what fits first
        assert [o.disabled for o in shown] == [False, False, True]
        assert "cannot: needs 4.5G on GPU 1, 1.1G free" in str(shown[2].prompt), shown[2].prompt
        options.focus()
        options.highlighted = 1
        await pilot.press("enter")
        assert isinstance(app.screen, ConfirmScreen)
        question = str(app.screen.query_one("#confirm-question").render())
        assert "bring qwen-0.5b in on GPU 1 of irina?" in question, question  # it wakes where it sleeps, not on GPU 0


def frozen_pool_app(models: list[dict]):
    """The frozen demo lab with this models section on irina; no agents behind it (a call would fail loudly)."""
    from console.lab.client import FleetClient
    from tests.console_fixtures import FROZEN_NOW, frozen_state

    state = frozen_state()
    base = {
        "machine": "irina",
        "engine": "sim",
        "since": FROZEN_NOW - 60,
        "gpus": [0],
        "vram_bytes": 4 * 1024**3,
        "simulated": True,
    }
    state.machines["irina"].apply_section("models", {"models": [{**base, **m} for m in models]})
    return CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)


async def test_w_on_a_warm_model_says_so_and_s_on_a_pinned_one_says_so_before_asking():
    app = frozen_pool_app(
        [{"name": "warm-one", "state": "warm"}, {"name": "pinned-one", "state": "warm", "pinned": True, "gpus": [1]}]
    )
    calls = []
    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = lambda *args, **kwargs: calls.append(args)
        await until_drawn(pilot)
        await pilot.press("colon", *"models", "enter")
        await until_drawn(pilot, ModelsScreen)
        table = app.screen.query_one(OrchestraTable)
        table.move_cursor(row=table.get_row_index("irina/warm-one"))
        await pilot.press("w")
        await wait_for(lambda: any(n.message == "warm-one is already warm" for n in app.notices))
        table.move_cursor(row=table.get_row_index("irina/pinned-one"))
        await pilot.press("s")
        await wait_for(lambda: any("pinned-one is pinned: unpin it (p)" in n.message for n in app.notices))
        assert isinstance(app.screen, ModelsScreen)  # no y/n first
        assert calls == [] and not any(n.message.startswith("warming") for n in app.notices)


async def test_s_on_a_model_whose_engine_cannot_sleep_says_so_and_names_cold_before_asking():
    app = frozen_pool_app([{"name": "mistral-7b-q4", "state": "warm", "engine": "llamacpp", "can_sleep": False}])
    calls = []
    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = lambda *args, **kwargs: calls.append(args)
        await until_drawn(pilot)
        await pilot.press("colon", *"models", "enter")
        await until_drawn(pilot, ModelsScreen)
        table = app.screen.query_one(OrchestraTable)
        table.move_cursor(row=table.get_row_index("irina/mistral-7b-q4"))
        await pilot.press("s")
        await wait_for(lambda: any("has no sleep mode: stop it with c (cold)" in n.message for n in app.notices))
        assert isinstance(app.screen, ModelsScreen) and calls == []  # no y/n, no call


async def test_shift_r_rotates_now_after_a_question():
    app = frozen_pool_app([{"name": "warm-one", "state": "warm"}])
    rotation = {"plan": [["warm-one"], ["other"]], "index": 0, "next_set": ["other"], "overhead_pct": 0.1, "target_pct": 1.0}
    app.state.machines["irina"].apply_section("models", {**app.state.machines["irina"].models.to_wire(), "rotation": rotation})
    calls = []

    async def call(machine, method, params=None, timeout=None):
        calls.append((machine, method))
        return {}

    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = call
        await until_drawn(pilot)
        await pilot.press("colon", *"models", "enter")
        await until_drawn(pilot, ModelsScreen)
        await pilot.press("R")
        await wait_for(lambda: isinstance(app.screen, ConfirmScreen))
        assert "Rotate now on irina?" in str(app.screen.query_one("#confirm-question").render())
        await pilot.press("y")
        await wait_for(lambda: calls == [("irina", "models.rotate")])


def test_rotation_figures_are_per_machine_in_human_durations():
    from agents.wire.sections.models import Rotation
    from console.tui.screens.models import rotation_text

    now = 1_790_000_000.0
    rotations = {
        "irina": Rotation(
            plan=[["a"], ["b"]], index=0, next_set=["b"], next_at=now + 13882, overhead_pct=0.587, target_pct=1.0, wall_s=7200
        ),
        "m5": Rotation(
            plan=[["c"], ["d"]], index=None, next_set=["c"], next_at=now + 90, overhead_pct=0.012, target_pct=1.0, wall_s=86400
        ),
        "pharaoh": None,
    }
    irina, m5 = rotation_text(rotations, now).splitlines()
    assert (
        irina.startswith("[b]irina[/b] rotation: step 1 of 2 · next in 3h51m")
        and "overhead 0.587% of 2h00m (target < 1%)[/]" in irina
    ), irina
    assert m5.startswith("[b]m5[/b] rotation: not rotated yet (2 sets) · next in 1m30s") and "overhead 0.012% of 24h00m" in m5, m5
    # each machine's line names its own models of the next set, not the lab-wide set
    irina, m5 = rotation_text(rotations, now, {"irina": {"a"}, "m5": {"c", "d"}}).splitlines()
    assert ": the next set has none of irina's models ·" in irina and "→ c ·" in m5, (irina, m5)
    assert "→" not in irina


def test_model_details_say_the_window_of_tokens_per_s():
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import models_human
    from console.tui.screens.models import detail_text

    fields = {
        "name": "talky",
        "machine": "box",
        "engine": "sim",
        "state": "warm",
        "since": 1.0,
        "gpus": [0],
        "simulated": True,
        "tokens_per_s": 41.84,
        "tokens_per_s_window_s": 10.0,
    }
    assert "41.8 tokens/s over the last 10 s" in detail_text(ModelInfo(**fields))
    lines = models_human([ModelInfo(**fields, vram_bytes=0, requests_running=1)], {}, {}).splitlines()
    assert lines[0].split()[7] == "TOK/S" and lines[1].split()[8] == "42"
    assert "TOK/S: generated tokens per second over the last 10 s" in lines
