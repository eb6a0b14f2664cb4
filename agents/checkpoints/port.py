"""What others read of the checkpoints component. Notify names a finished run's best checkpoint from its summary.

The checkpoints' owner extends this Protocol with what the others call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agents.wire.sections.checkpoints import RunSummary


@runtime_checkable
class CheckpointsPort(Protocol):
    def run_summaries(self) -> list[RunSummary]:
        """Every run the component watches, as its section shows it."""
        ...
