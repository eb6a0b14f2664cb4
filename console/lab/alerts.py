"""Alerts as the console sees them: the agents' "alerts" sections plus machines gone offline."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agents.wire.protocol import LinkStatus
from agents.wire.sections.alerts import AlertInfo, alert_id
from console.lab.state import LabState


@dataclass(frozen=True)
class AlertRow:
    """An alert as the console lists it: an agent's (AlertInfo), or a machine the console cannot reach (only it raises those)."""

    id: str
    rule: str
    level: str
    machine: str
    target: str
    message: str
    fired_at: float | None  # None: a machine never reached
    cleared_at: float | None = None
    acked_at: float | None = None
    job: str | None = None
    model: str | None = None

    @classmethod
    def of(cls, alert: AlertInfo) -> AlertRow:
        return cls(
            id=alert.id,
            rule=alert.rule,
            level=alert.level,
            machine=alert.machine,
            target=alert.target,
            message=alert.message,
            fired_at=alert.fired_at,
            cleared_at=alert.cleared_at,
            acked_at=alert.acked_at,
            job=alert.job,
            model=alert.model,
        )

    @property
    def active(self) -> bool:
        return self.cleared_at is None


def offline_rows(state: LabState, now: float, offline_for_s: float) -> list[AlertRow]:
    """A machine the console cannot reach is an alert only the console can raise."""
    out = []
    for view in state.machines.values():
        if view.online or view.link is LinkStatus.CONNECTING:
            continue
        if view.last_seen is not None and now - view.last_seen < offline_for_s:
            continue
        out.append(
            AlertRow(
                id=alert_id(view.name, "offline"),
                rule="offline",
                level="critical",
                machine=view.name,
                target="machine",
                message=f"{view.name} is {view.link}" + (f": {view.error}" if view.error else ""),
                fired_at=view.last_seen,
            )
        )
    return out


def offline_alerts(state: LabState, now: float, offline_for_s: float) -> list[dict[str, Any]]:
    """The offline alerts as `cetlab --json alerts` prints them, beside the agents' (the fields an AlertInfo has)."""
    return [
        {k: v for k, v in asdict(row).items() if k not in ("job", "model")} for row in offline_rows(state, now, offline_for_s)
    ]


def offline_history(state: LabState) -> list[AlertRow]:
    """The offline alerts that cleared (the console keeps them: no agent knows of them), newest last."""
    return [AlertRow(**entry) for entry in state.offline_history]


def active_alerts(state: LabState, now: float) -> list[AlertRow]:
    """Every active alert in the lab, the newest first."""
    alerts = offline_rows(state, now, state.lab.alerts.offline_for_s)
    for view in state.machines.values():
        if view.online:
            alerts += [AlertRow.of(alert) for alert in view.alerts.active]
    return sorted(alerts, key=lambda a: -(a.fired_at or 0))


def alerts_by_target(state: LabState, now: float) -> dict[tuple[str, str], list[AlertRow]]:
    """Active alerts keyed by (machine, target): target is "machine", "gpu0", "job 3", "model llama-3.1-8b", "disk".

    An alert on a GPU that a job holds is also filed under that job, so each badge finds its own.
    """
    out: dict[tuple[str, str], list[AlertRow]] = {}
    for alert in active_alerts(state, now):
        keys = {alert.target}
        if alert.job is not None:
            keys.add(f"job {alert.job}")
        if alert.model:
            keys.add(f"model {alert.model}")
        for key in keys:
            out.setdefault((alert.machine, key), []).append(alert)
    return out
