"""What the agent's loop calls on a component beside start, stop and section, declared once: every component takes
these as no-ops and overrides what it needs, so the loop calls them all without asking what a component has.

A tick has two phases: the owners of state (jobs, models, checkpoints, audit) update from the sample in
``on_telemetry``; then the readers (``reads_tick = True``: costs, alerts, notify) see that same tick, with the owners'
typed sections, in ``on_tick``. ``prefetch`` reads files from outside (a trainer's progress) off the loop before a
tick; ``stop_grace_s`` is how long the component's ``stop()`` may take (a part that stops child processes says more).
"""

from __future__ import annotations

from typing import ClassVar

from agents.runtime.stopping import STOP_DEADLINE_S
from agents.wire.protocol import Telemetry
from agents.wire.sections.tick import Tick


class Hooks:
    reads_tick: ClassVar[bool] = False
    stop_grace_s: ClassVar[float] = STOP_DEADLINE_S

    async def prefetch(self) -> None:
        return None

    def on_telemetry(self, telemetry: Telemetry) -> None:
        return None

    def on_tick(self, tick: Tick) -> None:
        return None
