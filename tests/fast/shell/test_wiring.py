"""Wiring between the merged parts: the start plan, the pool's VRAM, store notices, gateway costs."""

from __future__ import annotations

import os

import pytest

from agents.wire.protocol import Telemetry

pytestmark = pytest.mark.timeout(120)


async def test_a_full_disk_is_said_as_disk_full_by_the_rpc_and_a_disk_alert(tmp_path, caplog, monkeypatch):
    from agents.alerts.component import AlertsComponent
    from agents.costs.component import CostsComponent
    from agents.runtime.rpc import Peer
    from agents.runtime.store import Store
    from agents.shell.agent import Agent
    from agents.wire.catalogue.index import CATALOGUE
    from agents.wire.catalogue.method import Method, NoParams
    from agents.wire.lab.model import parse_lab
    from agents.wire.protocol import Role

    lab = parse_lab("lab: t\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n")
    agent = Agent(lab, "box", tmp_path, components=lambda core: [CostsComponent(core), AlertsComponent(core)])
    alerts = agent.find(AlertsComponent)
    assert alerts is not None
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    agent.store.execute("CREATE TABLE filler (blob BLOB)")

    test_write = Method("test.write", NoParams, NoParams)
    monkeypatch.setitem(CATALOGUE, "test.write", test_write)  # a method for this test only

    @agent.rpc.implements(test_write)
    async def write(peer: Peer, params: NoParams) -> NoParams:
        with agent.store.transaction() as db:
            db.execute("INSERT INTO filler VALUES (?)", (os.urandom(64 * 1024),))
        return NoParams()

    agent.tick()
    # SQLite's own SQLITE_FULL: state.db may not grow by one more page
    pages = agent.store.query("PRAGMA page_count")[0]["page_count"]
    agent.store.query(f"PRAGMA max_page_count = {pages}")
    answer = await agent.rpc.dispatch(
        Peer(role=Role.VIEWER, who="test", send=lambda line: None), {"id": 1, "method": "test.write"}
    )
    assert answer["error"]["code"] == "unavailable" and answer["error"]["message"].startswith("disk full"), answer
    for _ in range(3):
        agent.tick()
    (alert,) = [a for a in alerts.section().active if a.rule == "disk_full"]
    assert alert.level == "critical" and alert.target == "state.db" and "disk full" in alert.message
    assert not [r for r in caplog.records if r.exc_info]  # said, never a traceback
    agent.store.close()


def test_the_gateway_section_is_listed_and_parsed_like_every_other_section():
    from agents.runtime.view import MachineView
    from agents.wire.lab.model import parse_lab
    from agents.wire.sections.gateway import GatewaySection
    from agents.wire.sections.tick import SECTION_MODELS

    assert SECTION_MODELS["gateway"] == GatewaySection | None
    lab = parse_lab("lab: t\nmachines: [{name: box, gpus: none}]\n")
    view = MachineView(lab.machines[0])
    spend = {"name": "openai", "spend_month": 8.5, "monthly_budget": 10.0, "budget_pct": 85.0}
    view.apply_section("gateway", {"machine": "box", "url": "http://127.0.0.1:1/v1", "providers": [spend]})
    assert isinstance(view.gateway, GatewaySection) and view.gateway.providers[0].budget_pct == 85.0
    view.apply_section("gateway", {"machine": "box", "models": [{"name": "m", "tier": "local", "rps": "nan"}]})
    assert "gateway.models.0.rps" in view.problems["gateway"]  # numbers on the wire are finite or null


def test_provider_budget_alerts_fire_at_80_and_100_percent_from_the_gateway_section():
    from agents.alerts.component import AlertEngine
    from agents.wire.lab.model import Alerts
    from agents.wire.sections.costs import ProviderSpend
    from agents.wire.sections.gateway import GatewaySection

    engine = AlertEngine(Alerts())
    telemetry = Telemetry(machine="hub", t=1000.0)

    def fired(pct: float) -> set[tuple[str, str]]:
        spend = ProviderSpend(name="pricey", spend_month=pct / 100 * 20, monthly_budget=20.0, budget_pct=pct)
        observations = engine.observe(telemetry, gateway=GatewaySection(machine="hub", providers=[spend]))
        engine.evaluate(telemetry.t, observations, lambda obs, t: obs)
        return {(a.rule, a.level) for a in engine.active()}

    assert fired(50.0) == set()
    assert fired(87.0) == {("budget_80", "warning")}
    assert fired(104.0) == {("budget_80", "warning"), ("budget_100", "critical")}
    (critical,) = [a for a in engine.active() if a.rule == "budget_100"]
    assert "pricey: 104% of its monthly budget spent (20.80 of 20.00 USD)" == critical.message
