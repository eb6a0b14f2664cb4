"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles.

A tick event is ``{"t", "full", "changed": {section: value}}`` (see agents/events.py `TickEvent`); `status`
answers every section whole. Each section here serializes (``model_dump(mode="json")``) to
the JSON consoles read; numbers are finite or null by type (:data:`agents.protocol.Finite`).

Sections and their models (``SECTION_MODELS``):

    gpus        list[GpuSample]   only the GPUs that changed in a diff tick, all of them in a full one
    host        HostSample
    gpu_status  GpuStatus
    jobs        list[JobInfo]     active jobs and the newest finished ones
    models      ModelsSection | null   the models of this machine and the rotation plan (null: no models here)
    checkpoints list[RunSummary]
    costs       CostsSummary | null    null until the first tick is booked
    alerts      AlertsSection
    audit       AuditSection
    gateway     GatewaySection | null  on the gateway's machine only (agents/gateway/): traffic per model, spend, keys
    gpu_support GpuSupportSection  the stacks this machine launches and, per GPU, whether each runs there (agents/gpusupport/)
    faults      FaultsSection     the sections whose component raised in this tick, with the error (empty: all well)

Shape changes against the untyped sections (kept as small as the console allows):
- ``jobs[].diverged_at_step`` and ``jobs[].progress_problem`` are new (issue 11: a diverged
  run and a progress file that does not match its schema are shown on their job);
  ``jobs[].precision`` and ``jobs[].notes`` carry the trainer's (real lab);
- ``models.models[].error`` is an object (``ModelError``: message, exit_code, oom, log_tail ...),
  as it always was; read ``error.message`` for the one line;
- ``checkpoints[].problem`` (a run's bad progress.json) and ``CheckpointInfo.diverged_at_step`` are new;
- ``costs`` is null (not ``{}``) before the first tick;
- the rotation plan stays inside the ``models`` section (``models.rotation``), where consoles read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_serializer, field_validator

from agents.sections_gpu_support import GpuSupportSection
from agents.protocol import Finite, FiniteFloat, GpuBackend, GpuList, GpuSample, HostSample, Telemetry
from agents.states import JobState, ModelState, NodeState


# A recipe's launch parameter (lab.yaml trainers[].params: int, float, str, bool, choice)
ParamValue = bool | int | Finite | str

# The secondary states: each the exact values its producer writes (tests/test_typed_state.py checks them against it)
ProgressState = Literal["starting", "running", "saving", "finished", "failed"]  # a trainer's progress file (agents/train/progress.py)
Precision = Literal["bf16", "fp16", "fp32"]  # what a run trains in (agents/train/precision.py)
StopRequest = Literal["stop", "kill"]  # stop: SIGTERM, then SIGKILL after the grace; kill: SIGKILL now
EngineName = Literal["vllm", "transformers", "sim", "llamacpp", "sim-llamacpp"]  # agents/orchestra/engines.py, lab.yaml's engine
ModelOp = Literal["warm", "wake", "sleep", "swap", "cache", "cold"]  # the operation in flight on a model
ModelPhase = Literal["starting", "loading", "warm-up", "waking", "going to sleep", "stopping", "caching", "making the tiny model"]
CheckpointKind = Literal["adapter", "full", "unknown"]
SaveTimeSource = Literal["trainer", "file_times"]  # the trainer's progress reports, or the checkpoint's file times
AlertLevel = Literal["info", "warning", "critical"]
GatewayTier = Literal["local", "provider"]  # served in the lab, or a cloud provider's API


class Section(BaseModel):
    """A section model: extra keys are ignored on parsing, so an older console reads a newer agent."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------------------- machine


class GpuStatus(Section):
    backend: GpuBackend
    status: str | None = None  # why there are no GPU figures, e.g. "NVML library not found"
    simulated: bool = False


# ---------------------------------------------------------------------------- jobs


class CheckpointReport(Section):
    """A checkpoint as the trainer reported it in its progress file."""

    step: int
    path: str
    save_s: Finite = None  # wall time of the save alone
    at: Finite = None  # unix time the save ended


class JobProgress(Section):
    """What a job keeps of its trainer's progress file (the whole file is agents/documents.py's ``Progress``, which extends
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
    def seen(cls, state: NodeState, exit_code: int | None = None, error: str | None = None, ended_at: float | None = None,
             last_lines: list[str] | None = None) -> NodeStatus:
        """A status known without asking (the coordinator's own node, a node that does not answer), cut to what a node sends."""
        return cls(state=state, exit_code=exit_code, error=error[:NODE_ERROR_CHARS] if error is not None else None, ended_at=ended_at,
                   last_lines=[line[:NODE_LINE_CHARS] for line in (last_lines or [])[-NODE_LAST_LINES:]])


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


class JobDetail(JobInfo):
    """`jobs.get` and `jobs.start`: a job with its command line."""

    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    runner_pid: int | None = None


# ---------------------------------------------------------------------------- models


class ModelProgress(Section):
    phase: ModelPhase
    done_bytes: int | None = None
    total_bytes: int | None = None


class ModelError(Section):
    message: str
    exit_code: int | None = None
    oom: bool = False
    log_tail: list[str] = Field(default_factory=list)
    log_path: str | None = None
    t: Finite = None


class ModelInfo(Section):
    name: str
    machine: str
    engine: EngineName
    state: ModelState
    since: FiniteFloat
    gpus: list[int] = Field(default_factory=list)
    vram_bytes: int = 0
    vram_measured: bool = False  # vram_bytes is NVML's figure for the engine's processes, not the estimate
    cached_fraction: Finite = None
    size_bytes: int = 0
    load_s: Finite = None
    warmup_s: Finite = None
    wake_s: Finite = None
    swap_s: Finite = None
    requests_running: Finite = None
    requests_waiting: Finite = None
    tokens_per_s: Finite = None  # generated tokens per second over the last tokens_per_s_window_s
    tokens_per_s_window_s: Finite = None
    kv_cache_pct: Finite = None
    ttft_s: Finite = None
    # engine counters (reset when the engine restarts); the cost ledger prices tokens served from them
    prompt_tokens_total: Finite = None
    generation_tokens_total: Finite = None
    endpoint: str | None = None
    served_name: str | None = None
    adapters: list[str] = Field(default_factory=list)  # LoRA adapters loaded into its engine (the gateway routes them by name)
    pinned: bool = False
    op: ModelOp | None = None  # the operation in flight
    progress: ModelProgress | None = None
    error: ModelError | None = None
    cloud_equivalent: str | None = None
    simulated: bool = False

    @property
    def tokens_total(self) -> float | None:
        """Tokens served by the engine so far (prompt + generation), or None when it reports neither."""
        parts = [n for n in (self.prompt_tokens_total, self.generation_tokens_total) if n is not None]
        return sum(parts) if parts else None


class RotationRun(Section):
    """The last rotation: what moved and how long it took."""

    t: FiniteFloat
    index: int
    duration_s: Finite = None
    swaps: list[tuple[str, str]] = Field(default_factory=list)  # (out, in) on shared GPUs
    out: list[str] = Field(default_factory=list)
    up: list[str] = Field(default_factory=list)
    not_warm: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class Rotation(Section):
    plan: list[list[str]] = Field(default_factory=list)
    every_s: Finite = None
    index: int | None = None  # position in the plan; null at the start set
    next_set: list[str] | None = None
    next_at: Finite = None
    running: bool = False
    pinned: list[str] = Field(default_factory=list)
    unavailable_s: Finite = None
    wall_s: Finite = None
    overhead_pct: Finite = None
    target_pct: Finite = None
    last: RotationRun | None = None


class ModelsSection(Section):
    models: list[ModelInfo] = Field(default_factory=list)
    rotation: Rotation | None = None


# ---------------------------------------------------------------------------- checkpoints


ServingMode = Literal["adapter", "merged", "full", "gguf-adapter"]  # into a warm model; merged into its base; as it is; converted for llama.cpp
ServingStep = Literal["merging", "converting", "unloaded"]  # before its model exists; its adapter gone with a restarted engine


class Serving(Section):
    """How a checkpoint is served: by which model, how, and where that stands (its model's state, or a step of its own)."""

    model: str
    mode: ServingMode
    state: ModelState | ServingStep
    error: str | None = None


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


# ---------------------------------------------------------------------------- costs, alerts, audit


class ProviderSpend(Section):
    """A provider's spend against its monthly budget (alerts fire at 80% and 100%)."""

    name: str
    simulated: bool = False
    spend_today: FiniteFloat = 0.0
    spend_month: FiniteFloat = 0.0
    monthly_budget: Finite = None
    budget_pct: Finite = None
    key_set: bool = True  # its api_key_env is set in the agent's environment (or none is needed)


class CostsSummary(Section):
    """The header's money figures of one machine, every tick."""

    currency: str
    power_w: Finite = None
    now_per_hour: Finite = None
    today: Finite = None
    month: Finite = None
    cloud_equivalent_month: Finite = None
    missing: list[str] = Field(default_factory=list)  # prices lab.yaml lacks
    simulated: bool = False
    api: list[ProviderSpend] = Field(default_factory=list)  # the gateway's machine: API spend per provider, against its budget


ALERT_ID_FORM = "<machine>#<n>"  # "m5#12": a "#" no job id (m5-1) or model name carries


def alert_id(machine: str, n: int | str) -> str:
    """An alert's id: the machine that raised it and its number there ("offline" for the console's own)."""
    return f"{machine}#{n}"


def parse_alert_id(text: str, legacy: bool = False) -> tuple[str, str] | None:
    """(machine, n) of an alert id, n a number or "offline"; None when it is not one.

    `legacy` also takes the "<machine>-<n>" form alert ids had before, which a console of
    that version still sends to an agent of this one (the agent keeps only n in state.db).
    """
    machine, sep, n = text.rpartition("#")
    if not sep and legacy:
        machine, sep, n = text.rpartition("-")
    if not sep or not machine or not (n.isdigit() or n == "offline"):
        return None
    return machine, n


class AlertInfo(Section):
    id: str  # alert_id(machine, n): "<machine>#<n>"
    n: int
    machine: str
    rule: str
    target: str
    level: AlertLevel
    message: str
    fired_at: FiniteFloat
    value: Finite = None
    threshold: Finite = None
    gpu: int | None = None
    job: str | None = None
    model: str | None = None
    cleared_at: Finite = None
    acked_at: Finite = None
    acked_by: str | None = None
    acked: bool = False


class AlertsSection(Section):
    active: list[AlertInfo] = Field(default_factory=list)
    recent: list[AlertInfo] = Field(default_factory=list)  # the newest cleared ones
    unacked: int = 0


class AuditSection(Section):
    count: int = 0  # rows in the trail; who did what is for operators, through audit.list
    last_t: Finite = None


# ---------------------------------------------------------------------------- the lab gateway


class GatewayModelFigures(Section):
    """One model as the gateway sees it: its traffic over the last minute and what it caused."""

    name: str
    tier: GatewayTier
    where: str | None = None  # machine or provider
    state: str | None = None  # the pool's state for local models
    simulated: bool = False
    rps: FiniteFloat = 0.0
    in_flight: int = 0
    queued: int = 0
    p50_latency_s: Finite = None
    p95_latency_s: Finite = None
    p50_ttft_s: Finite = None
    p95_ttft_s: Finite = None
    requests: int = 0  # since the agent started
    wakes: int = 0  # bring-ups the gateway caused
    errors: int = 0


class KeyUse(Section):
    name: str
    revoked: bool = False
    rpm: int | None = None
    tokens_per_day: int | None = None
    requests: int = 0
    requests_last_minute: int = 0
    tokens_today: int = 0
    last_used: Finite = None


class GatewaySection(Section):
    url: str | None = None  # None until it listens
    machine: str
    error: str | None = None  # why it does not serve
    currency: str = "USD"
    peers: dict[str, str] = Field(default_factory=dict)  # machine -> online | offline | refused | untrusted ...
    models: list[GatewayModelFigures] = Field(default_factory=list)
    providers: list[ProviderSpend] = Field(default_factory=list)
    keys: list[KeyUse] = Field(default_factory=list)


# ---------------------------------------------------------------------------- a component that fails


class SectionFault(Section):
    """A section whose component raised in this tick: consoles show it failed, with the error, until it recovers.

    The section's last value stays on the consoles, marked stale by this; the fault clears on the first tick
    in which the component updates and reports again without raising."""

    section: str  # the section's name, as in SECTION_MODELS (the component's name)
    # update: on_telemetry; read: on_tick; section: making its section; refused: a client refused it as sent (never on the wire)
    phase: Literal["update", "read", "section", "refused"]
    error: str  # "<exception type>: <message>", one line
    since: FiniteFloat  # agent's wall time of the first failing tick in a row


class FaultsSection(Section):
    failed: list[SectionFault] = Field(default_factory=list)  # one per failing section, by name

    def of(self, section: str) -> SectionFault | None:
        return next((f for f in self.failed if f.section == section), None)


# ---------------------------------------------------------------------------- the tick


SECTION_MODELS: dict[str, Any] = {
    "gpus": GpuList,
    "host": HostSample,
    "gpu_status": GpuStatus,
    "jobs": list[JobInfo],
    "models": ModelsSection | None,
    "checkpoints": list[RunSummary],
    "costs": CostsSummary | None,
    "alerts": AlertsSection,
    "audit": AuditSection,
    "gateway": GatewaySection | None,
    "gpu_support": GpuSupportSection,
    "faults": FaultsSection,
}


@dataclass(frozen=True)
class Tick:
    """One tick as the readers (costs, alerts) see it: the sample and the sections its owners made of it."""

    telemetry: Telemetry
    jobs: list[JobInfo]
    models: ModelsSection | None
    gateway: GatewaySection | None = None  # only on the gateway's machine

    def model_list(self) -> list[ModelInfo]:
        return self.models.models if self.models is not None else []
