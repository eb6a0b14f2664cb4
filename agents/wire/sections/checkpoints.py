"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: checkpoints."""

from __future__ import annotations

from agents.wire.protocol import Finite
from agents.wire.sections.base import CheckpointKind, SaveTimeSource, Section
from agents.wire.sections.models import Serving
from agents.wire.states import JobState


class CheckpointInfo(Section):
    """One checkpoint folder (`checkpoints.list`)."""

    run: str
    step: int
    path: str
    epoch: Finite = None
    written_at: Finite = None
    size_bytes: int = 0
    loss: Finite = None
    eval_loss: Finite = None
    save_s: Finite = None
    save_s_from: SaveTimeSource | None = None
    is_best: bool = False
    kept: bool = False
    newest: bool = False
    kind: CheckpointKind = "unknown"
    has_optimizer: bool = False
    complete: bool = True
    problem: str | None = None
    in_use: str | None = None  # why it cannot be deleted now
    serving: Serving | None = None
    diverged_at_step: int | None = None  # its trainer_state.json logged a NaN or infinite loss at this step


class RunSummary(Section):
    """One run folder with checkpoints, as pushed in the checkpoints section."""

    run: str
    machine: str
    path: str
    job: str | None = None
    recipe: str | None = None
    job_state: JobState | None = None
    count: int = 0
    incomplete: int = 0
    newest_step: int | None = None
    best_step: int | None = None
    best_loss: Finite = None
    disk_bytes: int = 0
    save_s_total: Finite = None
    wall_s: Finite = None
    save_share_pct: Finite = None
    problem: str | None = None  # its progress.json does not match its schema
    # why its checkpoints are in use now ("step 180: job m5-2 resumed from it and is running"): it follows the jobs and
    # the serves, so a console whose listing said "in use" fetches it again when this changes
    in_use: list[str] = []
