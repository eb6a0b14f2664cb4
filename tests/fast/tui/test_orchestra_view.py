"""The Orchestra view against real agents: keys warm, sleep, swap, pin and stop models; modals confirm."""

from __future__ import annotations

import pytest
from textual.widgets import OptionList

from console.tui.app import CetlabApp
from console.tui.screens.modals import ConfirmScreen, PickModelScreen
from console.tui.screens.models import ModelsScreen
from tests.support.waits import until_drawn, wait_for
from widgets.orchestra_table import OrchestraTable

pytestmark = pytest.mark.timeout(120)


async def test_the_swap_picker_offers_what_fits_first_and_names_the_true_gpu():
    from console.lab.client import FleetClient
    from tests.support.console import FROZEN_NOW, frozen_state

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
    from tests.support.console import FROZEN_NOW, frozen_state

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
