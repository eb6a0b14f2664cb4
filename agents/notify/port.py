"""What the alerts component hands to notify: the alerts that fired or cleared in a tick."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agents.wire.sections.alerts import AlertInfo


@runtime_checkable
class NotifyPort(Protocol):
    def alerts_changed(self, fired: list[AlertInfo], cleared: list[AlertInfo]) -> None:
        """Queue each alert (once per firing) for the routes that take it; sending happens off the tick."""
        ...
