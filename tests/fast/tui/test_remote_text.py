"""Remote text is shown as text: markup (`[/x]`, `[@click=...]`), terminal escapes and bidi overrides that real agents
send in every field a view shows crash nothing, appear literally (control characters visibly), and link to nothing."""

from __future__ import annotations

from console.tui.app import CetlabApp
from tests.support.remote_text import HOSTILE, MARKUP, SHOWN, SIZE, check_screen
from tests.support.waits import until_drawn, wait_for


async def test_hostile_gateway_section_is_shown_as_text():
    """Gateway keys, models and providers are names the agents check (NAME_RE), so no real agent sends these: a
    gateway section holding them anyway (an older or a hostile agent) is still shown as text."""
    from console.lab.client import FleetClient
    from console.tui.screens.gateway import GatewayScreen
    from tests.support.console import FROZEN_NOW, frozen_state

    state = frozen_state(offline=())
    machine = state.lab.gateway.machine
    state.machines[machine].apply_section(
        "gateway",
        {
            "url": f"http://127.0.0.1:1/{HOSTILE}",
            "machine": machine,
            "error": HOSTILE,
            "peers": {HOSTILE: HOSTILE},
            "models": [
                {"name": HOSTILE, "tier": "local", "where": HOSTILE, "state": HOSTILE, "errors": 3}
            ],  # a tier is a Literal
            "providers": [{"name": HOSTILE, "spend_today": 1.0, "monthly_budget": 10.0, "budget_pct": 10.0, "key_set": False}],
            "keys": [{"name": HOSTILE, "requests": 2}],
        },
    )
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await app.switch_mode("gateway")
        await until_drawn(pilot, GatewayScreen)
        text = check_screen(app)
        assert app.is_running
    # the summary's url, error, peer and its state; the table's name, where and state; the provider; the key
    assert text.count(SHOWN) == 9, text


async def test_hostile_costs_report_is_refused_on_the_wire_and_shown_as_text_by_the_view():
    """Hardening IV, R9: `:costs` put an agent's `since.day` in its markup and parsed it as a date: two strings crashed
    every console that opened it. The wire checks a day (Day); the view shows what an older agent sent as text."""
    from console.lab.client import FleetClient
    from console.lab.costs import LabCosts, LabDay, lab_costs
    from console.tui.screens.costs import CostsScreen
    from tests.support.console import FROZEN_NOW, frozen_state

    day = {"day": "2026-11-01", "cost": 1.0}
    for bad in (MARKUP, "[/b]", "2026-02-30", HOSTILE):
        costs = lab_costs("EUR", {"box": {"machine": "box", "currency": "EUR", "timezone": "UTC", "since": {**day, "day": bad}}})
        assert costs.offline and costs.since is None, bad  # refused where the reply enters, said as the machine's problem
    crafted = LabCosts.model_validate(
        {
            **{f: None for f in LabCosts.model_fields if f not in ("currency", "since", "by_kind")},
            "currency": "EUR",
            "since": HOSTILE,
            "by_kind": "machine",
            "api_providers": [{"provider": HOSTILE, "month": 1.0}],
            "by": [{"machine": HOSTILE, "label": HOSTILE, "cost": 1.0}],
            "days": [LabDay(day=HOSTILE, cost=1.0, cloud_equivalent=None, kwh=None, api=None)],
            "missing": [HOSTILE],
            "offline": {HOSTILE: HOSTILE},
            "simulated": False,
        }
    )
    state = frozen_state(offline=())
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await until_drawn(pilot)
        await app.switch_mode("costs")
        screen = await wait_for(lambda: isinstance(app.screen, CostsScreen) and app.screen)
        screen.report = crafted
        screen.refresh_data()
        await pilot.pause()
        text = check_screen(app)
        assert app.is_running
    assert text.count(SHOWN) >= 5, text  # since (twice), the provider, the missing price, the offline machine and why
