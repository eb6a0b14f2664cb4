"""Alerts as the console sees them: the agents' "alerts" sections plus machines gone offline."""

from __future__ import annotations

from typing import Any

from agents.protocol import LinkStatus
from agents.sections import alert_id
from console.state import LabState


def offline_alerts(state: LabState, now: float, offline_for_s: float) -> list[dict[str, Any]]:
    """A machine the console cannot reach is an alert only the console can raise."""
    out = []
    for view in state.machines.values():
        if view.online or view.link is LinkStatus.CONNECTING:
            continue
        if view.last_seen is not None and now - view.last_seen < offline_for_s:
            continue
        out.append({
            "id": alert_id(view.name, "offline"), "rule": "offline", "level": "critical", "machine": view.name,
            "target": "machine", "message": f"{view.name} is {view.link}" + (f": {view.error}" if view.error else ""),
            "fired_at": view.last_seen, "cleared_at": None, "acked_at": None,
        })
    return out


def active_alerts(state: LabState, now: float) -> list[dict[str, Any]]:
    """Every active alert in the lab, the newest first."""
    alerts = offline_alerts(state, now, state.lab.alerts.offline_for_s)
    for view in state.machines.values():
        if view.online:  # as dicts: the view mixes them with the history that alerts.list answers
            alerts += [alert.model_dump(mode="json") for alert in view.alerts.active]
    return sorted(alerts, key=lambda a: -(a.get("fired_at") or 0))


def alerts_by_target(state: LabState, now: float) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Active alerts keyed by (machine, target): target is "machine", "gpu0", "job 3", "model llama-3.1-8b", "disk".

    An alert on a GPU that a job holds is also filed under that job, so each badge finds its own.
    """
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for alert in active_alerts(state, now):
        keys = {alert["target"]}
        if alert.get("job") is not None:
            keys.add(f"job {alert['job']}")
        if alert.get("model"):
            keys.add(f"model {alert['model']}")
        for key in keys:
            out.setdefault((alert["machine"], key), []).append(alert)
    return out
