"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: alerts."""

from __future__ import annotations

from pydantic import Field

from agents.wire.catalogue.method import OP, Method, Params
from agents.wire.schema import AlertId
from agents.wire.sections.alerts import AlertInfo
from agents.wire.sections.base import Section


class AlertListParams(Params):
    active: bool = False  # only alerts not cleared yet
    limit: int = Field(default=100, ge=1, le=1000)
    since: float | None = None  # unix time: alerts fired after it


class AckParams(Params):
    id: AlertId


class AlertList(Section):
    machine: str
    alerts: list[AlertInfo] = Field(default_factory=list)


ALERTS_LIST = Method(
    "alerts.list", AlertListParams, AlertList, doc="Alert history, newest first (active only with active: true)."
)


ALERTS_ACK = Method("alerts.ack", AckParams, AlertInfo, OP, "Acknowledge an alert: its badge goes, its history stays.")
