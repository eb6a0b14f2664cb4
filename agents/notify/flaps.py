"""Flap damping before the outbox: an alert that fires again within `notify.flap_hold` of clearing continues the
incident its routes were told of, instead of adding a firing and a resolve each time.

A firing is never delayed; its resolve is queued held for the hold time and taken back if the alert fires again
meanwhile (that pair collapses); the FLAPS_TO_SAY-th such flap sends one "flapping" notification, and the resolve
goes out once the alert has stayed clear for the hold time. A flapping rule filled the outbox with pairs (issue 30).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agents.wire.sections.alerts import AlertInfo

FLAPS_TO_SAY = 3  # fired again this many times within one incident: one notification says it flaps

Subject = tuple[str, str, int | None, str | None, str | None]  # rule, target, gpu, job, model: "the same alert"
Verdict = Literal["new", "flap", "flapping"]


def subject_of(alert: AlertInfo) -> Subject:
    return (alert.rule, alert.target, alert.gpu, alert.job, alert.model)


@dataclass
class Incident:
    first: AlertInfo  # the firing its routes were sent: its id names the incident's resolve and flapping rows
    cleared_at: float | None = None  # cleared then: its resolve is held until cleared_at + hold
    flaps: int = 0


class Flaps:
    """The incidents of the alerts that fired, by subject, until each has stayed clear for `hold_s`."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self._incidents: dict[Subject, Incident] = {}

    def fired(self, alert: AlertInfo, now: float) -> tuple[Verdict, Incident]:
        """ "new": tell the routes; "flap": take back the held resolve, nothing to send; "flapping": that, and say so."""
        self.prune(now)
        incident = self._incidents.get(subject_of(alert))
        if incident is None or incident.cleared_at is None:  # (None: it fired again unseen cleared: a new one)
            incident = self._incidents[subject_of(alert)] = Incident(alert)
            return "new", incident
        incident.cleared_at = None
        incident.flaps += 1
        return ("flapping" if incident.flaps == FLAPS_TO_SAY else "flap"), incident

    def cleared(self, alert: AlertInfo, now: float) -> Incident:
        """The incident whose resolve this clear is (one of its own when its firing is unknown: fired before a restart)."""
        incident = self._incidents.setdefault(subject_of(alert), Incident(alert))
        incident.cleared_at = now
        return incident

    def first_of(self, alert: AlertInfo) -> AlertInfo:
        """The firing its routes were told of for this alert: its incident's first (itself, outside one)."""
        incident = self._incidents.get(subject_of(alert))
        return incident.first if incident is not None else alert

    def prune(self, now: float) -> None:
        """Forget incidents clear for the hold time: their resolves have gone out, a firing now is a new one."""
        over = [s for s, i in self._incidents.items() if i.cleared_at is not None and now - i.cleared_at >= self.hold_s]
        for subject in over:
            del self._incidents[subject]
