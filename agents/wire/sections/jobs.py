"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: jobs."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, field_serializer, field_validator

from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.sections.base import ParamValue, Precision, ProgressState, Section, StopRequest
from agents.wire.states import JobState, NodeState


class CheckpointReport(Section):
    """A checkpoint as the trainer reported it in its progress file."""

    step: int
    path: str
    save_s: Finite = None  # wall time of the save alone
    at: Finite = None  # unix time the save ended


class JobProgress(Section):
    """What a job keeps of its trainer's progress file (the whole file is agents/wire/documents.py's ``Progress``, which extends
    this): persisted with the job, sent by a node to its coordinator, shown in ``JobInfo``."""

    state: ProgressState | None = None
    step: int | None = None
    max_steps: int | None = None
    epoch: Finite = None
    loss: Finite = None
    learning_rate: Finite = None
    tokens_per_s: Finite = None
    samples_per_s: Finite = None
    eta_s: Finite = None
    checkpoints: list[CheckpointReport] = Field(default_factory=list)
    updated_at: Finite = None
    error: str | None = None
    stop_reason: str | None = None
    precision: Precision | None = None
    notes: list[str] = Field(default_factory=list)


NODE_LAST_LINES = 3  # last log lines of a node named in a multi-node job's error


NODE_ERROR_CHARS = 8000  # a node's error, as its status carries it


NODE_LINE_CHARS = 4000  # one of its last log lines


NODE_LOSS_POINTS = 60  # the loss history a node sends its coordinator


class NodeStatus(Section):
    """A node of a multi-node job as its coordinator sees it: a node's answer to `jobs.node_*`, checked where it enters
    the coordinator, or what the coordinator makes of a node that does not answer (``offline``)."""

    state: NodeState
    exit_code: int | None = None
    error: str | None = Field(default=None, max_length=NODE_ERROR_CHARS)
    ended_at: Finite = None
    last_lines: list[Annotated[str, Field(max_length=NODE_LINE_CHARS)]] = Field(default_factory=list, max_length=NODE_LAST_LINES)
    progress: JobProgress | None = None  # rank 0's progress, when rank 0 runs on this node (c10d may rank any node 0)
    loss_points: list[tuple[int, Finite]] = Field(default_factory=list, max_length=NODE_LOSS_POINTS)

    @field_validator("progress", mode="wrap")
    @classmethod
    def _fitting_progress(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> JobProgress | None:
        """{} (the wire's "none") and a progress that does not fit the progress file's schema are none; the rest of the
        node's news stands."""
        if not value:
            return None
        try:
            progress: JobProgress | None = handler(value)
        except ValidationError:
            return None
        return progress

    @field_serializer("progress")
    def _progress_on_wire(self, progress: JobProgress | None) -> dict[str, Any]:
        return progress.to_wire() if progress is not None else {}  # {} for none, as nodes have always sent it

    @classmethod
    def seen(
        cls,
        state: NodeState,
        exit_code: int | None = None,
        error: str | None = None,
        ended_at: float | None = None,
        last_lines: list[str] | None = None,
    ) -> NodeStatus:
        """A status known without asking (the coordinator's own node, a node that does not answer), cut to what a node sends."""
        return cls(
            state=state,
            exit_code=exit_code,
            error=error[:NODE_ERROR_CHARS] if error is not None else None,
            ended_at=ended_at,
            last_lines=[line[:NODE_LINE_CHARS] for line in (last_lines or [])[-NODE_LAST_LINES:]],
        )


class JobNode(Section):
    """One machine of a multi-node job, as its coordinator last saw it."""

    machine: str
    gpus: list[int] = Field(default_factory=list)
    state: NodeState  # its job's state there, or "offline" while its agent does not answer
    exit_code: int | None = None
    error: str | None = None


class JobInfo(Section):
    """One trainer job, as pushed in the jobs section (trimmed: `jobs.get` adds argv, cwd, runner_pid)."""

    id: str
    recipe: str
    machine: str
    gpus: list[int] = Field(default_factory=list)
    state: JobState
    exit_code: int | None = None
    step: int | None = None
    max_steps: int | None = None
    epoch: Finite = None
    loss: Finite = None  # null after a divergence: diverged_at_step says where
    loss_history: list[Finite] = Field(default_factory=list)  # logged losses, oldest first
    learning_rate: Finite = None
    samples_per_s: Finite = None
    tokens_per_s: Finite = None
    eta_s: Finite = None
    checkpoints: list[CheckpointReport] = Field(default_factory=list)
    trainer_state: ProgressState | None = None  # the progress file's state
    stop_reason: str | None = None
    precision: Precision | None = None  # as the trainer chose it for the GPU
    notes: list[str] = Field(default_factory=list)  # the trainer's remarks, e.g. "tf32 off: it needs compute capability 8.0"
    started_at: FiniteFloat
    ended_at: Finite = None
    elapsed_s: Finite = None
    pid: int | None = None
    params: dict[str, ParamValue] = Field(default_factory=dict)
    output_dir: str
    log_path: str
    stop_requested: StopRequest | None = None
    adopted: bool = False
    starved: bool = False
    error: str | None = None
    last_lines: list[str] = Field(default_factory=list)
    diverged_at_step: int | None = None  # the first step whose loss was NaN or infinite
    progress_problem: str | None = None  # the progress file does not match its schema (what and where)
    simulated: bool = False
    nodes: list[JobNode] = Field(default_factory=list)  # a multi-node job on its coordinator (the first node): every node
    node_rank: int | None = None  # a node of a multi-node job: its torchrun --node-rank
    coordinator: str | None = None  # ... and the machine whose agent coordinates it (the job's row is there)
    damaged: bool = False  # its record in state.db could not be read: only its id (and why, in error) are known
    queued_as: str | None = None  # the lab queue's entry that started it ("pharaoh:12")
    user: str | None = None  # who submitted it to the queue


class JobDetail(JobInfo):
    """`jobs.get` and `jobs.start`: a job with its command line."""

    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    runner_pid: int | None = None
