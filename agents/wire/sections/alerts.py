"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: alerts."""

from __future__ import annotations

from pydantic import Field

from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.sections.base import AlertLevel, Section

ALERT_ID_FORM = "<machine>#<n>"  # "m5#12": a "#" no job id (m5-1) or model name carries


def alert_id(machine: str, n: int | str) -> str:
    """An alert's id: the machine that raised it and its number there ("offline" for the console's own)."""
    return f"{machine}#{n}"


def parse_alert_id(text: str, legacy: bool = False) -> tuple[str, str] | None:
    """(machine, n) of an alert id, n a number or "offline"; None when it is not one.

    `legacy` also takes the "<machine>-<n>" form alert ids had before, which a console of
    that version still sends to an agent of this one (the agent keeps only n in state.db).
    """
    machine, sep, n = text.rpartition("#")
    if not sep and legacy:
        machine, sep, n = text.rpartition("-")
    if not sep or not machine or not (n.isdigit() or n == "offline"):
        return None
    return machine, n


class AlertInfo(Section):
    id: str  # alert_id(machine, n): "<machine>#<n>"
    n: int
    machine: str
    rule: str
    target: str
    level: AlertLevel
    message: str
    fired_at: FiniteFloat
    value: Finite = None
    threshold: Finite = None
    gpu: int | None = None
    job: str | None = None
    model: str | None = None
    cleared_at: Finite = None
    acked_at: Finite = None
    acked_by: str | None = None
    acked: bool = False


class AlertsSection(Section):
    active: list[AlertInfo] = Field(default_factory=list)
    recent: list[AlertInfo] = Field(default_factory=list)  # the newest cleared ones
    unacked: int = 0
