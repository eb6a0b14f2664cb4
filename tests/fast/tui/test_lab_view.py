"""The Textual console: Pilot against the live demo agents, and snapshots of a frozen lab."""

from __future__ import annotations

import time

import pytest

from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.machine import MachineScreen
from console.tui.screens.modals import HelpScreen
from tests.support.console import FROZEN_NOW, frozen_jobs, frozen_state
from tests.support.lab_view import SIZE
from tests.support.waits import until_drawn, wait_for
from widgets.machine_card import MachineCard


@pytest.fixture
def frozen_app(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    state = frozen_state()
    client = FleetClient(state.lab, state)
    yield CetlabApp(state.lab, client=client, connect=False, clock=lambda: FROZEN_NOW)
    monkeypatch.delenv("TZ")
    time.tzset()


def test_snapshot_fleet(snap_compare, frozen_app):
    assert snap_compare(frozen_app, terminal_size=SIZE, run_before=until_drawn)


def test_snapshot_machine(snap_compare, frozen_app):
    async def open_m5(pilot):
        await until_drawn(pilot, FleetScreen)
        await pilot.press("enter")
        await until_drawn(pilot, MachineScreen)

    assert snap_compare(frozen_app, terminal_size=SIZE, run_before=open_m5)


def test_snapshot_help(snap_compare, frozen_app):
    async def open_help(pilot):
        await until_drawn(pilot, FleetScreen)
        await pilot.press("question_mark")
        await wait_for(lambda: isinstance(pilot.app.screen, HelpScreen))
        await pilot.pause()

    assert snap_compare(frozen_app, terminal_size=SIZE, run_before=open_help)


def test_labstate_parses_each_section_once_and_refuses_what_does_not_fit():
    from agents.wire.protocol import GpuSample, HostSample
    from agents.wire.states import JobState

    state = frozen_state(offline=())
    view = state.machines["m5"]
    assert isinstance(view.gpus[0], GpuSample) and isinstance(view.host, HostSample) and view.host.cpu_count == 28
    state.apply_tick("m5", {"t": FROZEN_NOW, "changed": {"jobs": frozen_jobs()}})
    assert view.jobs[0].state is JobState.RUNNING and view.jobs[0].loss_history and not view.problems

    # a section in a shape the agent never sends (the old "bare or {section: [...]}" guess) is refused, named, and the last good one kept
    state.apply_tick("m5", {"t": FROZEN_NOW + 1, "changed": {"jobs": {"jobs": frozen_jobs()[:1]}}})
    assert len(view.jobs) == 4 and "m5 sent a jobs section that does not fit" in view.problems["jobs"]
    # numbers are finite or null by type: a NaN temperature is a missing one; a GPU without its index is refused, with where
    nan = view.gpus[0].model_dump(mode="json") | {"temp_c": float("nan")}
    state.apply_tick("m5", {"t": FROZEN_NOW + 2, "changed": {"gpus": [nan]}})
    assert view.gpus[0].temp_c is None and "gpus" not in view.problems
    state.apply_tick("m5", {"t": FROZEN_NOW + 2, "changed": {"gpus": [{"name": "Tesla V100"}]}})
    assert "gpus.0.index: Field required" in view.problems["gpus"] and view.gpus[0].name == "Tesla V100"
    state.apply_tick("m5", {"t": FROZEN_NOW + 3, "changed": {"jobs": frozen_jobs()[:2]}})
    assert len(view.jobs) == 2 and "jobs" not in view.problems  # a good section clears the complaint


async def test_slash_filters_the_fleet_and_every_table():
    from console.tui.screens.jobs import JobsScreen
    from console.tui.screens.modals import AskTextScreen
    from widgets.jobs_table import JobsTable

    state = frozen_state()
    state.machines["m5"].apply_section("jobs", frozen_jobs())
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)

    async def filter_by(pilot, text: str) -> None:
        await pilot.press("slash")
        await wait_for(lambda: isinstance(app.screen, AskTextScreen) and app.screen.query("#ask-text"))
        app.screen.query_one("#ask-text").value = text
        await pilot.press("enter")
        await wait_for(lambda: not isinstance(app.screen, AskTextScreen))

    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot, FleetScreen)
        await filter_by(pilot, "IRINA")
        shown = [card.machine for card in app.screen.query(MachineCard) if card.display]
        assert shown == ["irina"]
        await filter_by(pilot, "")
        assert all(card.display for card in app.screen.query(MachineCard))
        # a GPU model or a model of the pool finds its machine; nothing found says so
        await filter_by(pilot, "P40")
        assert [card.machine for card in app.screen.query(MachineCard) if card.display] == ["m5"]
        await filter_by(pilot, "phi-3")
        assert [card.machine for card in app.screen.query(MachineCard) if card.display] == [
            "workstation"
        ]  # the demo serves phi-3-mini with vLLM on the RTX 3050
        nothing = app.screen.query_one("#fleet-nothing")
        assert not nothing.display
        await filter_by(pilot, "no-such-thing")
        assert nothing.display and "no machine matches 'no-such-thing'" in str(nothing.render())
        await filter_by(pilot, "")
        assert not nothing.display

        await pilot.press("colon", *"jobs", "enter")
        await until_drawn(pilot, JobsScreen)
        table = app.screen.query_one(JobsTable)
        assert table.row_count == 4
        await filter_by(pilot, "p40")
        assert table.row_count == 1 and table.selected().id == "m5-3"
        state.machines["m5"].apply_section("jobs", frozen_jobs())  # the next tick keeps the filter
        app.screen.refresh_data()
        assert table.row_count == 1
        await filter_by(pilot, "no-such-job")  # an empty table said nothing: it says the filter hid every row
        assert table.row_count == 0 and table.no_match is not None and table.no_match.display
        assert "no row of 4 matches 'no-such-job'" in str(table.no_match.render())
        await filter_by(pilot, "")
        assert table.row_count == 4 and not table.no_match.display


async def test_the_audit_views_two_counts_agree_in_their_words():
    from console.tui.screens.audit import AuditScreen

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    base = {"who": "ops", "role": "operator", "params": "{}", "message": None, "duration_s": 0.1}
    entries = [
        {**base, "id": 1, "t": FROZEN_NOW - 5, "method": "models.warm", "outcome": "ok"},
        {**base, "id": 2, "t": FROZEN_NOW - 4, "method": "models.sleep", "outcome": "conflict", "message": "no sleep mode"},
    ]

    async def call(machine, method, params=None, timeout=None):
        mine = entries if machine == "m5" else []
        return {"machine": machine, "total": len(mine), "entries": mine, "refusals": []}

    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = call
        await until_drawn(pilot)
        await pilot.press("colon", *"audit", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, AuditScreen) and app.screen)
        screen.action_fetch()
        summary = screen.query_one("#audit-summary")
        await wait_for(lambda: "2 operator actions" in str(summary.render()))
        text = str(summary.render())
        # the action the agent refused is a failed action; "refused calls" are only those a key's role did not allow
        assert "(1 failed)" in text and "no calls refused for want of a role" in text and "no refused calls" not in text, text


async def test_the_audit_view_shows_the_refused_calls_the_agents_count():
    from console.tui.screens.audit import AuditScreen

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    entry = {
        "id": 1,
        "t": FROZEN_NOW - 5,
        "who": "ops",
        "role": "operator",
        "method": "models.warm",
        "params": "{}",
        "outcome": "ok",
        "message": None,
        "duration_s": 0.1,
    }
    refusal = {"minute": FROZEN_NOW - 60, "who": "intern", "role": "viewer", "method": "jobs.start", "count": 7}

    async def call(machine, method, params=None, timeout=None):
        assert method == "audit.list"
        entries, refusals = ([entry], [refusal]) if machine == "m5" else ([], [])
        return {"machine": machine, "total": len(entries), "entries": entries, "refusals": refusals}

    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = call
        await until_drawn(pilot)
        await pilot.press("colon", *"audit", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, AuditScreen) and app.screen)
        screen.action_fetch()
        summary = screen.query_one("#audit-summary")
        await wait_for(lambda: "7 refused calls" in str(summary.render()))
        assert "intern (viewer) jobs.start ×7 on m5" in str(summary.render())


async def test_an_offline_spell_reaches_the_alerts_history_once_the_machine_is_back():
    from console.tui.screens.alerts import AlertsScreen

    state = frozen_state()  # pharaoh unreachable for 75 s: an offline alert
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)

    async def call(machine, method, params=None, timeout=None):
        return {"machine": machine, "alerts": []}  # the agents know nothing of it

    async with app.run_test(size=(160, 50)) as pilot:
        app.client.call = call
        await until_drawn(pilot)
        await pilot.press("colon", *"alerts", "enter")
        screen = await wait_for(lambda: isinstance(app.screen, AlertsScreen) and app.screen)
        state.set_link("pharaoh", "online")  # it answers again: the alert clears
        await pilot.press("h")
        table = screen.query_one("#alerts-table")
        await wait_for(lambda: any(a.rule == "offline" and a.machine == "pharaoh" and a.cleared_at for a in table.items.values()))
