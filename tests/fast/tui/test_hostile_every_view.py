"""Every console view over ticks whose every string is hostile (issue 30, item 5): each machine's `status` built from
the catalogue's result model with a clipboard write (OSC 52), a terminal query, markup and a 10 kB line in each string
field its validators let through, as an older or a hostile agent could push them. Each view (at its key, with a pilot),
and a machine's detail, renders without a crash, shows no control character and carries no live link."""

from __future__ import annotations

import pytest

from agents.wire.catalogue.index import CATALOGUE
from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.machine import MachineScreen
from console.tui.views import VIEWS
from tests.support.console import FROZEN_NOW, frozen_state
from tests.support.hostile_replies import HOSTILE, LONG, hostile_reply
from tests.support.remote_text import SIZE, check_screen
from tests.support.waits import until_drawn, wait_for
from widgets.wire import visible


@pytest.mark.timeout(240)
@pytest.mark.parametrize("text", [HOSTILE, LONG], ids=["escapes", "10 kB"])
async def test_every_view_over_hostile_ticks(text):
    state = frozen_state(offline=())
    status = hostile_reply(CATALOGUE["status"].result, text)
    for name in state.machines:
        state.apply_status(name, status)
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    shown = visible(HOSTILE)[:40]  # the start of the text as the console shows it (a cell may cut the rest)
    seen: dict[str, str] = {}
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        for view in VIEWS:
            await app.switch_mode(view)
            await until_drawn(pilot, type(app.screen))
            seen[view] = check_screen(app)
            assert app.is_running
        await app.switch_mode("fleet")
        await until_drawn(pilot)
        await pilot.press("enter")
        await wait_for(lambda: isinstance(app.screen, MachineScreen), timeout=20)
        await until_drawn(pilot, MachineScreen)
        seen["machine"] = check_screen(app)
        assert app.is_running
    # the agent's strings were shown (as text, controls visible), not dropped: the views that list what ticks carry
    showing = {view for view, text_now in seen.items() if shown[:12] in text_now}
    assert {"fleet", "jobs", "models", "machine"} <= showing, sorted(showing)
