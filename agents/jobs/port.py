"""What other components may ask of the jobs: ``JobsPort``, found with ``core.find(JobsPort)``, and the ``JobView`` it hands out.

The checkpoints read the jobs (which run wrote into which folder, what it resumed from) and start a recipe again
to resume a run; nothing else of the jobs' internals is theirs to touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agents.wire.sections.jobs import CheckpointReport, JobDetail
from agents.wire.states import JOB_ACTIVE, JobState


@dataclass(frozen=True)
class JobView:
    """A job as other components see it: a copy, so a scan thread reads no live state."""

    id: str
    recipe: str
    state: JobState
    started_at: float
    ended_at: float | None
    output_dir: str
    argv: tuple[str, ...]
    params: dict[str, Any]
    reports: tuple[CheckpointReport, ...]  # the trainer's checkpoint entries (progress.json)
    loss_points: tuple[tuple[int, float], ...]
    gpus: tuple[int, ...] = ()
    eta_s: float | None = None  # the trainer's own estimate of the time left

    @property
    def active(self) -> bool:
        return self.state in JOB_ACTIVE


@runtime_checkable
class JobsPort(Protocol):
    """The jobs of this machine, as another component may use them."""

    def views(self) -> list[JobView]:
        """Every job in memory as a read-only copy, oldest first."""
        ...

    def view(self, job_id: str) -> JobView:
        """One job (in memory or in state.db); a RemoteError NOT_FOUND names it when there is none."""
        ...

    async def launch(self, recipe: str, params: dict[str, Any]) -> JobDetail:
        """Start a recipe of this machine with these launch params (over all its nodes when it has nodes); a refused start
        is a typed RemoteError before any process exists."""
        ...
