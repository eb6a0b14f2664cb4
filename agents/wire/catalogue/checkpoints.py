"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: checkpoints."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, NoParams, Params, Root
from agents.wire.protocol import (
    Finite,
)
from agents.wire.schema import ModelName, ParamName, RunName
from agents.wire.sections.base import Section
from agents.wire.sections.checkpoints import CheckpointInfo, RunSummary
from agents.wire.sections.jobs import JobDetail


class RunParams(Params):
    run: RunName


class StepParams(RunParams):
    step: int = Field(ge=0)


class ResumeParams(StepParams):
    params: dict[ParamName, Any] = Field(default_factory=dict, max_length=64)  # overrides of the run's recipe params


class ServeParams(StepParams):
    model: ModelName | None = None  # a warm model to load the adapter into, or to borrow engine/GPUs from


class DeleteParams(StepParams):
    confirm_special: bool = False  # needed to delete the best or the newest checkpoint


class KeepParams(StepParams):
    kept: bool = True


class PruneParams(RunParams):
    keep_last: int = Field(ge=0, le=100000)


class RunSummaryList(Root):
    model_config = ConfigDict(defer_build=True)

    root: list[RunSummary]


class Curves(Section):
    loss: list[tuple[int, Finite]] = Field(default_factory=list)  # (step, loss)
    eval_loss: list[tuple[int, Finite]] = Field(default_factory=list)


class RunCheckpoints(RunSummary):
    """`checkpoints.list`: a run, its checkpoints (oldest first) and its loss curves."""

    checkpoints: list[CheckpointInfo] = Field(default_factory=list)
    curves: Curves = Field(default_factory=Curves)


class Resumed(JobDetail):
    resumed_from: CheckpointInfo


class Served(Section):
    """`checkpoints.serve`: what serves the checkpoint now (it comes up in the background)."""

    run: str
    step: int
    mode: str  # adapter | merged | full | gguf-adapter
    model: str
    state: str  # a ModelState, or merging | converting
    endpoint: str | None = None
    engine: str | None = None
    served_name: str | None = None
    base_matches: bool | None = None
    why_merged: str | None = None
    adapter_gguf: str | None = None
    simulated: bool = False


class Deleted(Section):
    run: str
    deleted: list[CheckpointInfo] = Field(default_factory=list)
    freed_bytes: int = 0


class PrunedCheckpoint(CheckpointInfo):
    reason: str  # why it was kept or skipped


class Pruned(Section):
    run: str
    keep_last: int
    deleted: list[CheckpointInfo] = Field(default_factory=list)
    kept: list[PrunedCheckpoint] = Field(default_factory=list)
    skipped: list[PrunedCheckpoint] = Field(default_factory=list)
    freed_bytes: int = 0


CHECKPOINTS_RUNS = Method(
    "checkpoints.runs",
    NoParams,
    RunSummaryList,
    doc="Every run with checkpoints on this machine: counts, best, disk, save-time share.",
)


CHECKPOINTS_LIST = Method(
    "checkpoints.list", RunParams, RunCheckpoints, doc="One run's checkpoints (oldest first) and its loss curves."
)


CHECKPOINTS_RESUME = Method(
    "checkpoints.resume", ResumeParams, Resumed, OP, "A new job of the run's recipe, resuming from this checkpoint."
)


CHECKPOINTS_SERVE = Method(
    "checkpoints.serve", ServeParams, Served, OP, "Serve a checkpoint: adapter into a warm model, or as a new model."
)


CHECKPOINTS_DELETE = Method(
    "checkpoints.delete", DeleteParams, Deleted, OP, "Delete one checkpoint (the best or newest only with confirm_special)."
)


CHECKPOINTS_KEEP = Method(
    "checkpoints.keep", KeepParams, CheckpointInfo, OP, "Mark a checkpoint kept (prune never deletes it), or un-keep it."
)


CHECKPOINTS_PRUNE = Method(
    "checkpoints.prune", PruneParams, Pruned, OP, "Delete all but the best, the last N and the kept checkpoints."
)
