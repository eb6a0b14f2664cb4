"""Alert rules evaluated on the agent every tick: a threshold held for a while fires, hysteresis clears."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from agents.alerts.rules import GPU_RULES, HOST_RULES, JOB_RULES, MODEL_RULES, PROVIDER_RULES, Observation, View
from agents.runtime.hooks import Hooks
from agents.runtime.store import DiskFull
from agents.wire.catalogue.alerts import ALERTS_ACK, ALERTS_LIST, AckParams, AlertList
from agents.wire.catalogue.alerts import AlertListParams as ListParams
from agents.wire.events import Notice
from agents.wire.lab.model import Alerts, Lab
from agents.wire.local_events import AlertsChanged
from agents.wire.protocol import ErrorCode, RemoteError, Telemetry
from agents.wire.sections.alerts import ALERT_ID_FORM, AlertInfo, AlertsSection, alert_id, parse_alert_id
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo
from agents.wire.sections.tick import Tick
from agents.wire.states import JOB_ACTIVE

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.rpc import Peer

DISK_FULL_HOLD_S = 60.0  # a state.db write that failed for want of space keeps the disk alert up this long
log = logging.getLogger("cetlab.alerts")

SECTION_RECENT = 10  # cleared alerts kept in the section; the rest through alerts.list
INSERTED = ("rule", "target", "level", "message", "value", "threshold", "gpu", "job", "model", "fired_at")  # a new alert's row

SCHEMA = [
    """CREATE TABLE alerts (
        n INTEGER PRIMARY KEY AUTOINCREMENT,  -- the alert id is "<machine>#<n>" (agents.wire.sections.alerts.alert_id)
        rule TEXT NOT NULL, target TEXT NOT NULL, level TEXT NOT NULL, message TEXT NOT NULL,
        value REAL, threshold REAL, gpu INTEGER, job TEXT, model TEXT,
        fired_at REAL NOT NULL, cleared_at REAL, acked_at REAL, acked_by TEXT)""",
    "CREATE INDEX alerts_active ON alerts (cleared_at)",
]


@dataclass
class Alert:
    n: int
    machine: str
    rule: str
    target: str
    level: str
    message: str
    fired_at: float
    value: float | None = None
    threshold: float | None = None
    gpu: int | None = None
    job: str | None = None
    model: str | None = None
    cleared_at: float | None = None
    acked_at: float | None = None
    acked_by: str | None = None

    @property
    def id(self) -> str:
        return alert_id(self.machine, self.n)

    def info(self) -> AlertInfo:
        return AlertInfo(id=self.id, **asdict(self), acked=self.acked_at is not None)

    def to_json(self) -> dict[str, Any]:
        return self.info().to_wire()


@dataclass
class _Track:
    over_since: float | None = None
    clear_since: float | None = None
    alert: Alert | None = None


@dataclass
class _LossBest:
    loss: float
    step: int


@dataclass
class AlertEngine:
    """The rules and their state; pure: feed it observations with times, it says what fired and cleared."""

    settings: Alerts
    tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)
    best: dict[str, _LossBest] = field(default_factory=dict)

    def observe(
        self,
        telemetry: Telemetry,
        jobs: list[JobInfo] | None = None,
        models: list[ModelInfo] | None = None,
        gateway: GatewaySection | None = None,
    ) -> list[Observation]:
        """Every rule's view of this tick: the tables of agents/alerts/rules.py, each over its targets, in order."""
        view = View(self.settings, {g.index: g for g in telemetry.gpus if not g.failed}, gateway)
        jobs, models = jobs or [], models or []
        out: list[Observation] = []
        for g in view.gpus.values():
            for gpu_rule in GPU_RULES:
                out += gpu_rule(self, view, g)
        for job in jobs:
            for job_rule in JOB_RULES:
                out += job_rule(self, view, job)
        for job_id in set(self.best) - {j.id for j in jobs if j.state in JOB_ACTIVE}:
            del self.best[job_id]
        for model in models:
            for model_rule in MODEL_RULES:
                out += model_rule(self, view, model)
        for provider in gateway.providers if gateway is not None else []:
            for provider_rule in PROVIDER_RULES:
                out += provider_rule(self, view, provider)
        for host_rule in HOST_RULES:
            out += host_rule(self, view, telemetry.host)
        return out

    def steps_without_improvement(self, job_id: str, job: JobInfo) -> tuple[int, _LossBest] | None:
        step, loss = job.step, job.loss
        if step is None or loss is None:
            return None
        best = self.best.get(job_id)
        if best is None or loss < best.loss or step < best.step:  # a lower loss, or a job restarted from scratch
            best = self.best[job_id] = _LossBest(float(loss), step)
        return step - best.step, best

    def evaluate(
        self, t: float, observations: list[Observation], new_alert: Callable[[Observation, float], Alert]
    ) -> tuple[list[Alert], list[Alert]]:
        """Advance every rule's state to time t; `new_alert(observation, t)` makes a fired Alert. Returns (fired, cleared)."""
        fired, cleared = [], []
        seen = set()
        for obs in observations:
            key = (obs.rule, obs.target)
            seen.add(key)
            track = self.tracks.setdefault(key, _Track())
            if track.alert is None:
                track.over_since = (t if track.over_since is None else track.over_since) if obs.over else None
                if track.over_since is not None and t - track.over_since >= obs.for_s:
                    track.alert = new_alert(obs, t)
                    track.over_since = track.clear_since = None
                    fired.append(track.alert)
            else:
                track.clear_since = (t if track.clear_since is None else track.clear_since) if obs.clear else None
                if track.clear_since is not None and t - track.clear_since >= self.settings.clear_for_s:
                    track.alert.cleared_at = t
                    cleared.append(track.alert)
                    track.alert = track.clear_since = None
        for key in list(self.tracks):
            if key not in seen:  # the GPU, job or model is gone: nothing left to be wrong
                track = self.tracks.pop(key)
                if track.alert is not None:
                    track.alert.cleared_at = t
                    cleared.append(track.alert)
        return fired, cleared

    def active(self) -> list[Alert]:
        return [t.alert for t in self.tracks.values() if t.alert is not None]


# ---------------------------------------------------------------------------- the component


class AlertsComponent(Hooks):
    """Component "alerts": the engine on every tick, history in SQLite, notices, ack."""

    reads_tick = True

    name = "alerts"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.engine = AlertEngine(core.lab.alerts)
        self._section = AlertsSection()
        self._unsaved = 0  # numbers (negative) of alerts state.db had no room for
        self._register()

    async def start(self) -> None:
        store = self.core.store
        store.migrate("alerts", SCHEMA)
        for row in store.query("SELECT * FROM alerts WHERE cleared_at IS NULL"):
            # still firing when the agent stopped: keep it so it clears (or not) on what it sees now
            alert = Alert(machine=self.core.machine.name, **row)
            self.engine.tracks[(alert.rule, alert.target)] = _Track(alert=alert)
        self._refresh()

    async def stop(self) -> None:
        pass

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml: the rules' thresholds apply from the next tick (what fires now clears or not by them)."""
        self.engine.settings = new.alerts

    def _new_alert(self, obs: Observation, t: float) -> Alert:
        alert = Alert(
            n=0,
            machine=self.core.machine.name,
            rule=obs.rule,
            target=obs.target,
            level=obs.level,
            message=obs.message,
            value=obs.value,
            threshold=obs.threshold,
            gpu=obs.gpu,
            job=obs.job,
            model=obs.model,
            fired_at=t,
        )
        fields = {k: v for k, v in asdict(alert).items() if k in INSERTED}
        try:
            with self.core.store.transaction() as db:
                row = db.execute(
                    f"INSERT INTO alerts ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})", tuple(fields.values())
                ).lastrowid
            if row is None:
                raise RuntimeError("state.db gave the new alert no row number")
            alert.n = row
        except DiskFull:  # the alert that says so must not be lost to the full disk: shown, not kept in the history
            self._unsaved -= 1
            alert.n = self._unsaved
        return alert

    def on_tick(self, tick: Tick) -> None:
        """Evaluate every rule on this tick: the sample and the jobs and models of the same tick."""
        core = self.core
        observations = self.engine.observe(tick.telemetry, tick.jobs, tick.model_list(), tick.gateway)
        # a write to state.db failed for want of space lately (the ledger's, an action's ...)
        store = core.store
        full = store.full_at is not None and tick.telemetry.t - store.full_at < DISK_FULL_HOLD_S
        observations.append(
            Observation("disk_full", "state.db", full, not full, 0.0, "critical", store.disk_full or "state.db writes")
        )
        if store.notice:  # state.db was corrupt or lost at this start: a badge on the machine row, until the next start
            observations.append(Observation("state_lost", "machine", True, False, 0.0, "critical", store.notice))
        fired, cleared = self.engine.evaluate(tick.telemetry.t, observations, self._new_alert)
        if cleared:
            with store.transaction() as db:
                db.executemany("UPDATE alerts SET cleared_at=? WHERE n=?", [(a.cleared_at, a.n) for a in cleared])
        for alert in fired:
            log.warning("alert %s %s: %s", alert.id, alert.rule, alert.message)
            info = alert.info()
            core.notify(Notice(level=info.level, message=alert.message, alert=info))
        for alert in cleared:
            log.info("alert %s cleared: %s", alert.id, alert.message)
            core.notify(Notice(level="info", message=f"cleared: {alert.message}", alert=alert.info()))
        if fired or cleared:  # notify (lab.yaml's routes) takes them from the core: queued now, sent off the tick
            self._refresh(fired, cleared)

    def _refresh(self, fired: list[Alert] | None = None, cleared: list[Alert] | None = None) -> None:
        """Rebuild the section and tell the agent's other components (notify) what fired, cleared and fires now."""
        active = sorted(self.engine.active(), key=lambda a: -a.fired_at)
        recent = self.core.store.query(
            "SELECT * FROM alerts WHERE cleared_at IS NOT NULL ORDER BY n DESC LIMIT ?", (SECTION_RECENT,)
        )
        self._section = AlertsSection(
            active=[a.info() for a in active],
            recent=[Alert(machine=self.core.machine.name, **r).info() for r in recent],
            unacked=sum(1 for a in active if a.acked_at is None),
        )
        self.core.publish(
            AlertsChanged(
                fired=[a.info() for a in fired or []], cleared=[a.info() for a in cleared or []], active=self._section.active
            )
        )

    def section(self) -> AlertsSection:
        return self._section

    def _register(self) -> None:
        agent = self.core
        rpc = agent.rpc

        @rpc.implements(ALERTS_LIST)
        async def list_alerts(peer: Peer, params: ListParams) -> AlertList:
            where: list[str] = ["1=1"]
            args: list[Any] = []
            if params.active:
                where.append("cleared_at IS NULL")
            if params.since is not None:
                where.append("fired_at > ?")
                args.append(params.since)
            rows = agent.store.query(
                f"SELECT * FROM alerts WHERE {' AND '.join(where)} ORDER BY n DESC LIMIT ?", (*args, params.limit)
            )
            return AlertList(machine=agent.machine.name, alerts=[Alert(machine=agent.machine.name, **r).info() for r in rows])

        @rpc.implements(ALERTS_ACK)
        async def ack(peer: Peer, params: AckParams) -> AlertInfo:
            parsed = parse_alert_id(params.id, legacy=True)
            if parsed is None or not parsed[1].isdigit():
                raise RemoteError(
                    ErrorCode.INVALID_PARAMS,
                    f"alert id {params.id!r} is not one: alert ids are {ALERT_ID_FORM}, "
                    f"e.g. {alert_id(agent.machine.name, 12)} (see `cetlab alerts --all`)",
                )
            machine, n = parsed
            if machine != agent.machine.name:
                raise RemoteError(
                    ErrorCode.NOT_FOUND, f"no alert {params.id!r} on {agent.machine.name}: it names machine {machine!r}"
                )
            now = time.time()
            with agent.store.transaction() as db:
                db.execute("UPDATE alerts SET acked_at=?, acked_by=? WHERE n=? AND acked_at IS NULL", (now, peer.who, int(n)))
            rows = agent.store.query("SELECT * FROM alerts WHERE n=?", (int(n),))
            if not rows:
                raise RemoteError(
                    ErrorCode.NOT_FOUND, f"no alert {params.id!r} on {agent.machine.name} (see `cetlab alerts --all`)"
                )
            for alert in self.engine.active():
                if alert.n == int(n) and alert.acked_at is None:
                    alert.acked_at, alert.acked_by = rows[0]["acked_at"], rows[0]["acked_by"]
            log.info("alert %s acknowledged by %s", params.id, peer.who)
            self._refresh()
            return Alert(machine=agent.machine.name, **rows[0]).info()
