"""Components are built with a narrow core (agents/runtime/core.py), never the Agent, and reach each other only through ports
or the events they publish on the core.

These run the real components (real SQLite) on a small core made here: no Agent, no SSH, no sampler. The peers they
reach are small stand-ins that provide only the port, so what the component may call of another is the port's
Protocol and nothing more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.alerts.component import AlertsComponent
from agents.costs.component import CostsComponent
from agents.costs.port import CostsPort, LedgerTotal
from agents.gateway.port import GatewayPort
from agents.runtime.bus import Bus
from agents.runtime.rpc import Peer
from agents.runtime.store import Store
from agents.wire.lab.model import parse_lab
from agents.wire.local_events import AlertsChanged
from agents.wire.protocol import GpuSample, HostSample, Role, Telemetry
from agents.wire.sections.alerts import AlertInfo
from agents.wire.sections.costs import ProviderSpend
from agents.wire.sections.tick import Tick
from tests.support.small_core import SmallCore

LAB = (
    "lab: t\ncosts: {electricity_per_kwh: 0.2}\nalerts: {temp_for_s: 0, clear_for_s: 0}\n"
    "machines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"
)


class NotifyStandIn:
    """Takes the alerts' news from the core, as notify does, and nothing else."""

    def __init__(self, core: SmallCore) -> None:
        self.fired: list[AlertInfo] = []
        self.cleared: list[AlertInfo] = []
        self.active: list[AlertInfo] = []
        core.subscribe(AlertsChanged, self.alerts_changed)

    def alerts_changed(self, news: AlertsChanged) -> None:
        self.fired += news.fired
        self.cleared += news.cleared
        self.active = news.active


class GatewayStandIn:
    """Provides GatewayPort and nothing else."""

    def provider_spend(self) -> list[ProviderSpend]:
        return [ProviderSpend(name="cloud", spend_today=0.5, spend_month=2.0, monthly_budget=10.0, budget_pct=20.0)]

    def spend_by_day(self, since_day: str) -> dict[str, dict[str, float]]:
        return {"cloud": {"2026-11-01": 1.5, "2026-11-24": 0.5}}


def small_core(tmp_path: Path, *parts: Any) -> SmallCore:
    lab = parse_lab(LAB)
    return SmallCore(
        lab=lab, machine=lab.machine("box"), state_dir=tmp_path, store=Store(tmp_path / "state.db"), parts=list(parts)
    )


def tick(t: float, temp_c: float) -> Tick:
    gpu = GpuSample(index=0, name="Tesla P4", temp_c=temp_c, power_w=30.0, util_pct=0.0, simulated=True)
    return Tick(Telemetry(machine="box", t=t, gpus=[gpu], host=HostSample(), simulated=True), [], None)


def test_the_port_protocols_tell_the_stand_ins_apart():
    assert isinstance(GatewayStandIn(), GatewayPort) and not isinstance(GatewayStandIn(), CostsPort)


async def test_alerts_built_with_a_core_publish_what_fires_and_clears_on_it_for_notify(tmp_path):
    core = small_core(tmp_path)
    notify = NotifyStandIn(core)
    alerts = AlertsComponent(core)
    await alerts.start()
    alerts.on_tick(tick(100.0, temp_c=99.0))
    assert [(a.id, a.rule, a.target) for a in notify.fired] == [("box#1", "gpu_hot", "gpu0")]
    assert [a.id for a in notify.active] == ["box#1"]  # what notify re-sends to Alertmanager
    assert [event for event, _ in core.events] == ["notice"]  # consoles are told through the core
    alerts.on_tick(tick(101.0, temp_c=40.0))
    assert [(a.id, a.cleared_at) for a in notify.cleared] == [("box#1", 101.0)]
    assert notify.active == []
    core.store.close()


async def test_a_restarted_alerts_component_says_what_still_fires_at_its_start(tmp_path):
    core = small_core(tmp_path)
    alerts = AlertsComponent(core)
    await alerts.start()
    alerts.on_tick(tick(100.0, temp_c=99.0))
    again = SmallCore(lab=core.lab, machine=core.machine, state_dir=tmp_path, store=core.store)  # the same state.db
    notify = NotifyStandIn(again)
    await AlertsComponent(again).start()
    assert [a.id for a in notify.active] == ["box#1"] and notify.fired == []  # fired before: re-sent, not sent again
    core.store.close()


def test_a_subscriber_that_raises_neither_stops_the_publisher_nor_the_other_subscribers():
    bus = Bus()
    seen: list[AlertsChanged] = []

    def broken(_news: AlertsChanged) -> None:
        raise RuntimeError("a broken subscriber")

    bus.subscribe(AlertsChanged, broken)
    bus.subscribe(AlertsChanged, seen.append)
    bus.publish(AlertsChanged())
    bus.publish(object())  # no subscriber: nobody called
    assert seen == [AlertsChanged()]


async def test_alerts_without_notify_on_the_core_still_fire(tmp_path):
    core = small_core(tmp_path)
    alerts = AlertsComponent(core)
    await alerts.start()
    alerts.on_tick(tick(100.0, temp_c=99.0))
    assert [a.rule for a in alerts.section().active] == ["gpu_hot"]
    core.store.close()


async def test_costs_built_with_a_core_read_the_gateways_spend_through_its_port_and_answer_costs_port(tmp_path):
    core = small_core(tmp_path, GatewayStandIn())
    costs = CostsComponent(core)
    assert isinstance(costs, CostsPort)
    await costs.start()
    costs.on_tick(tick(100.0, temp_c=40.0))
    costs.on_tick(tick(101.0, temp_c=40.0))
    summary = costs.section()
    assert summary is not None and [(p.name, p.spend_month) for p in summary.api] == [("cloud", 2.0)]
    report = await core.rpc.dispatch(
        Peer(role=Role.VIEWER, who="test", send=lambda line: None), {"id": 1, "method": "costs.get", "params": {}}
    )
    assert report["result"]["api"]["providers"][0]["provider"] == "cloud"
    totals = costs.ledger_totals()
    assert totals and all(isinstance(row, LedgerTotal) for row in totals) and {row.kind for row in totals} >= {"host"}
    core.store.close()


async def test_costs_without_a_gateway_report_no_api_spend(tmp_path):
    core = small_core(tmp_path)
    costs = CostsComponent(core)
    await costs.start()
    costs.on_tick(tick(100.0, temp_c=40.0))
    summary = costs.section()
    assert summary is not None and summary.api == []
    assert costs.report(None, "job")["api"] is None
    core.store.close()
