"""The events components publish to one another on one agent (agents/runtime/bus.py): typed, in-process, never sent."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.wire.sections.alerts import AlertInfo


@dataclass(frozen=True)
class AlertsChanged:
    """The alerts component's news: at its start (the alerts still firing from before), in a tick where alerts fired or
    cleared, and on an ack. ``active`` is every alert firing now, newest first (what notify re-sends to Alertmanager)."""

    fired: list[AlertInfo] = field(default_factory=list)
    cleared: list[AlertInfo] = field(default_factory=list)
    active: list[AlertInfo] = field(default_factory=list)
