"""Events one component publishes to the others on the same agent (AgentCore.publish / subscribe).

A component that has news for others (the alerts that fired) publishes a typed event (agents/wire/local_events.py)
and knows nothing of who takes it; a component that wants it subscribes to the event's class. Handlers run in the
publisher's call, in the order they subscribed: the tick that fired an alert also queues its notification.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

E = TypeVar("E")
log = logging.getLogger("cetlab.bus")


class Bus:
    def __init__(self) -> None:
        self._handlers: dict[type[Any], list[Callable[[Any], None]]] = {}

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Call handler with every event of exactly this class published from now on."""
        self._handlers.setdefault(kind, []).append(handler)

    def publish(self, event: object) -> None:
        """Hand event to its subscribers. One that raises is logged and the others still get it: the publisher's
        work (an alert fired and stored) is done and is not undone by a subscriber's failure."""
        for handler in self._handlers.get(type(event), []):
            try:
                handler(event)
            except Exception:
                log.exception("a subscriber to %s failed", type(event).__name__)
