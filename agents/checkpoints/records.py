"""What the checkpoints component remembers of the checkpoints it serves: one record per checkpoint path."""

from __future__ import annotations

from dataclasses import dataclass

from agents.wire.sections.models import Serving


@dataclass
class ServedRecord:
    """A checkpoint being served: the wire's ``Serving`` (model, mode, state, error) and what only the agent needs."""

    serving: Serving
    engine_serial: int | None = None  # an adapter's: the engine it was loaded into (a restarted engine has lost it)
    adapter: str | None = None  # the name an adapter was loaded under


ServedRecords = dict[str, ServedRecord]  # checkpoint path -> its record
