"""What others read of the alerts component (notify re-sends what fires now): the alerts active now."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agents.wire.sections.alerts import AlertInfo


@runtime_checkable
class AlertsPort(Protocol):
    def active_alerts(self) -> list[AlertInfo]: ...
