"""The method catalogue: every RPC method with its params model, its result model, its role and its doc.

Both ends read it. The agent's registry refuses a handler for a method that is not here, or with other
params; readers (CLI verbs, screens, the gateway router) call ``await request(caller, machine, MODELS_LIST)``
and get the typed reply, validated where it enters, or ``ReplyInvalid`` naming the method and the field.

Replies that are a list (``jobs.list``) or may be null (``gateway.status``) have a ``RootModel`` as their
result: read ``.root``. Result models ignore keys they do not know (a newer agent adds fields), and
``model_dump(mode="json", exclude_unset=True)`` gives back the JSON the agent sent.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import date
from typing import Any, Generic, Iterable, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from agents.sections_gpu_support import GpuSupportSection
from agents.sections_notify import NotifyStatus, TestResult
from agents.protocol import (
    ErrorCode,
    Finite,
    FiniteFloat,
    GpuSample,
    Hello,
    HistoryParams,
    HostSample,
    IntervalParams,
    RemoteError,
    Role,
    SubscribeParams,
)
from agents.schema import NAME_RE, NAME_RULE, Name
from agents.sections import (
    NodeStatus,
    AlertInfo,
    AlertsSection,
    AuditSection,
    CheckpointInfo,
    CostsSummary,
    FaultsSection,
    GatewaySection,
    GpuStatus,
    JobDetail,
    JobInfo,
    ModelInfo,
    ModelsSection,
    Rotation,
    RunSummary,
    Section,
)
from agents.states import JobState

__all__ = ["CATALOGUE", "Caller", "Method", "ReplyInvalid", "parse_result", "request", "request_all"]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


# ============================================================================ params


class Params(BaseModel):
    """A method's params: unknown keys are refused; the schema is built on first use (the CLI starts cold)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)


class NoParams(Params):
    """A method that takes no params (an empty object, or none)."""


class CostsParams(Params):
    since: date | None = None  # the lab's local date, YYYY-MM-DD; default: this month
    by: Literal["machine", "job", "model"] = "machine"


# -- jobs


class StartParams(Params):
    recipe: str = Field(max_length=64)
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)


class JobParams(Params):
    id: str = Field(max_length=100)


class StopParams(JobParams):
    grace_s: float | None = Field(default=None, ge=0, le=86400)


class LogsParams(JobParams):
    tail_lines: int = Field(default=100, ge=0, le=10000)
    offset: int | None = Field(default=None, ge=0)  # continue from here instead of the tail
    follow: bool = False  # push new lines as `log` events to this connection


class JobListParams(Params):
    limit: int = Field(default=100, ge=1, le=10000)


class NodeStartParams(Params):
    id: str = Field(pattern=NAME_RE)
    recipe: str = Field(max_length=64)
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)
    node_rank: int = Field(ge=1, le=1024)  # rank 0 is the coordinator's own node
    rdzv_port: int = Field(ge=1024, le=65535)


class NodeStopParams(Params):
    id: str = Field(max_length=100)
    kill: bool = False
    grace_s: float | None = Field(default=None, ge=0, le=86400)
    reason: str | None = Field(default=None, max_length=4000)  # the coordinator failed the job: why


class NodeStatusParams(Params):
    id: str = Field(max_length=100)


# -- models


class ModelParams(Params):
    model: str = Field(pattern=NAME_RE)


class PinParams(ModelParams):
    pinned: bool = True


class SwapParams(Params):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    out: str = Field(pattern=NAME_RE)
    in_: str = Field(alias="in", pattern=NAME_RE)


class AdapterParams(ModelParams):
    name: str = Field(pattern=NAME_RE)
    path: str = Field(min_length=1, max_length=4096)


# -- checkpoints


class RunParams(Params):
    run: str = Field(min_length=1, max_length=200)


class StepParams(RunParams):
    step: int = Field(ge=0)


class ResumeParams(StepParams):
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)  # overrides of the run's recipe params


class ServeParams(StepParams):
    model: str | None = Field(default=None, max_length=64)  # a warm model to load the adapter into, or to borrow engine/GPUs from


class DeleteParams(StepParams):
    confirm_special: bool = False  # needed to delete the best or the newest checkpoint


class KeepParams(StepParams):
    kept: bool = True


class PruneParams(RunParams):
    keep_last: int = Field(ge=0, le=100000)


# -- gateway, notify, audit, alerts, sim


class KeyAddParams(Params):
    name: str = Field(pattern=NAME_RE)
    rpm: int | None = Field(default=None, ge=1, le=1_000_000)  # requests per minute
    tokens_per_day: int | None = Field(default=None, ge=1)


class KeyNameParams(Params):
    name: str = Field(pattern=NAME_RE)


class NotifyTestParams(Params):
    route: Name


class AuditListParams(Params):
    limit: int = Field(default=200, ge=1, le=5000)
    since: float | None = None  # unix time
    before_id: int | None = Field(default=None, ge=1)  # page back from here
    who: str | None = Field(default=None, max_length=200)
    key: str | None = Field(default=None, max_length=200)  # a key's fingerprint (SHA256:...)
    method: str | None = Field(default=None, max_length=100)


class AlertListParams(Params):
    active: bool = False  # only alerts not cleared yet
    limit: int = Field(default=100, ge=1, le=1000)
    since: float | None = None  # unix time: alerts fired after it


class AckParams(Params):
    id: str = Field(max_length=100)


class OverrideParams(Params):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: int = Field(ge=0)
    temp_c: float | None = Field(default=None, ge=-50, le=200)
    util_pct: float | None = Field(default=None, ge=0, le=100)
    mem_used_bytes: int | None = Field(default=None, ge=0, le=2**50)
    power_w: float | None = Field(default=None, ge=0, le=10_000)
    clear: bool = False  # drop this GPU's overrides first (alone: back to the simulation)


# ============================================================================ results
# A reply that is one of the tick's sections reuses its model (agents/sections.py); the rest are here.


# -- core


class Ping(Section):
    t: FiniteFloat  # the agent's clock


class StatusReply(Section):
    """`status`: the latest sample and every section, whole (a section is absent where its component does not run)."""

    t: FiniteFloat
    machine: str
    simulated: bool = False
    gpus: list[GpuSample] = Field(default_factory=list)
    host: HostSample | None = None
    gpu_status: GpuStatus | None = None
    faults: FaultsSection | None = None
    jobs: list[JobInfo] | None = None
    models: ModelsSection | None = None
    checkpoints: list[RunSummary] | None = None
    costs: CostsSummary | None = None
    alerts: AlertsSection | None = None
    audit: AuditSection | None = None
    gateway: GatewaySection | None = None
    gpu_support: GpuSupportSection | None = None
    notify: None = None  # the notify component has no section (notify.status answers)


class GpuHistory(Section):
    index: int
    util_pct: list[Finite] = Field(default_factory=list)
    mem_used_bytes: list[int | None] = Field(default_factory=list)
    temp_c: list[Finite] = Field(default_factory=list)
    power_w: list[Finite] = Field(default_factory=list)


class HostHistory(Section):
    cpu_pct: list[Finite] = Field(default_factory=list)
    ram_used_bytes: list[int | None] = Field(default_factory=list)


class HistoryReply(Section):
    """`history`: columns of the ring buffer, one value per sample time in ``t``."""

    interval_s: FiniteFloat
    simulated: bool = False
    t: list[FiniteFloat] = Field(default_factory=list)
    gpus: list[GpuHistory] = Field(default_factory=list)
    host: HostHistory = Field(default_factory=HostHistory)


class Topics(Section):
    topics: list[str] = Field(default_factory=list)  # this connection's topics now (log:<job> for each log it follows)


class Interval(Section):
    interval_s: FiniteFloat


class MethodInfo(Section):
    name: str
    role: Role
    doc: str = ""


class MethodList(RootModel):  # not RootModel[...]: that builds a schema at import (the CLI starts cold)
    model_config = ConfigDict(defer_build=True)

    root: list[MethodInfo]


class SimOverride(Section):
    gpu: int
    overrides: dict[str, float | int] = Field(default_factory=dict)
    simulated: bool = True


# -- jobs


class RecipeParam(Section):
    """One launch parameter of a recipe, as the launch form shows it."""

    name: str
    type: Literal["int", "float", "str", "bool", "choice"] = "str"
    default: int | float | bool | str | None = None
    choices: list[str] = Field(default_factory=list)
    min: Finite = None
    max: Finite = None
    help: str = ""
    flag: str | None = None  # the command-line flag it becomes


class RecipeInfo(Section):
    name: str
    machine: str
    gpus: list[int] = Field(default_factory=list)
    launcher: Literal["local", "torchrun"] = "local"
    nproc_per_node: int | None = None
    command: list[str] = Field(default_factory=list)
    output_dir: str
    params: list[RecipeParam] = Field(default_factory=list)


class RecipeList(RootModel):  # not RootModel[...]: that builds a schema at import (the CLI starts cold)
    model_config = ConfigDict(defer_build=True)

    root: list[RecipeInfo]


class JobList(RootModel):  # not RootModel[...]: that builds a schema at import (the CLI starts cold)
    model_config = ConfigDict(defer_build=True)

    root: list[JobInfo]


class JobLogs(Section):
    id: str
    path: str
    lines: list[str] = Field(default_factory=list)
    offset: int  # where the next read continues
    state: JobState


# -- models


class ModelsList(ModelsSection):
    """`models.list`: the models section of one machine."""

    machine: str


class ModelEvent(Section):
    t: FiniteFloat
    event: str
    from_state: str | None = None
    to_state: str | None = None
    duration_s: Finite = None
    detail: Any = None


class SwapRecord(Section):
    t: FiniteFloat
    out_model: str | None = None
    in_model: str | None = None
    free_s: Finite = None
    bring_up_s: Finite = None
    total_s: Finite = None
    engine_s: Finite = None
    rotation: int | None = None  # 1: the swap was part of a rotation


class ModelDetail(ModelInfo):
    """`models.get`: a model with its path, history, swaps, load phases and log tail."""

    path: str
    history: list[ModelEvent] = Field(default_factory=list)
    swaps: list[SwapRecord] = Field(default_factory=list)
    load_phases: dict[str, FiniteFloat] = Field(default_factory=dict)
    log_tail: list[str] = Field(default_factory=list)
    log_path: str | None = None


class SwapResult(Section):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    out: ModelInfo
    in_: ModelInfo = Field(alias="in")


class AdapterLoaded(ModelInfo):
    adapter: str  # the adapter just loaded


# -- checkpoints


class RunSummaryList(RootModel):  # not RootModel[...]: that builds a schema at import (the CLI starts cold)
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


# -- costs


class CostsNow(Section):
    power_w: Finite = None
    per_hour: Finite = None
    missing: list[str] = Field(default_factory=list)


class Priced(Section):
    """Money for a span of the ledger: what it cost here, what the same work would cost in the cloud."""

    kwh: Finite = None
    energy_cost: Finite = None  # null: no electricity price in lab.yaml
    rent: Finite = None
    cost: Finite = None
    uptime_s: Finite = None
    gpu_hours: Finite = None
    gpu_busy_hours: Finite = None
    tokens: int = 0
    cloud_gpu: Finite = None
    # money (tokens / 1e6 x each model's price), as the agent sent it: its empty sum is the int 0, kept an int in --json
    cloud_tokens: int | Finite = None
    cloud_equivalent: Finite = None
    saving: Finite = None
    saving_pct: Finite = None
    missing: list[str] = Field(default_factory=list)  # prices lab.yaml lacks


class PricedDay(Priced):
    day: str  # YYYY-MM-DD, the lab's local date


class PricedGroup(Priced):
    """One row of `by`: the machine, or one job or model (by: job | model)."""

    machine: str
    job: str | None = None
    model: str | None = None
    label: str | None = None


class ApiProviderSpend(Section):
    provider: str
    simulated: bool = False
    monthly_budget: Finite = None
    # money as the gateway sent it: a sum over nothing is its int 0, kept an int in --json (as cloud_tokens)
    today: int | Finite = None
    month: int | Finite = None
    since: int | Finite = None
    budget_pct: Finite = None


class ApiSpend(Section):
    providers: list[ApiProviderSpend] = Field(default_factory=list)
    today: int | Finite = None
    month: int | Finite = None
    since: int | Finite = None
    days: dict[str, Finite] = Field(default_factory=dict)


class CostsReport(Section):
    """`costs.get`: energy and money of one machine: now, today, this month, since a day, by job or model, per day."""

    machine: str
    currency: str
    timezone: str
    rented: bool = False
    simulated: bool = False
    now: CostsNow = Field(default_factory=CostsNow)
    today: Priced = Field(default_factory=Priced)
    month: Priced = Field(default_factory=Priced)
    since: PricedDay
    by: list[PricedGroup] = Field(default_factory=list)
    days: list[PricedDay] = Field(default_factory=list)
    api: ApiSpend | None = None  # the gateway's machine only


# -- gateway


class GatewayStatus(RootModel):  # not RootModel[...]: that builds a schema at import (the CLI starts cold)
    """`gateway.status`: the gateway's section, or null where it does not run."""

    model_config = ConfigDict(defer_build=True)

    root: GatewaySection | None


class KeyIssued(Section):
    name: str
    key: str  # the token: shown once, never again
    rpm: int | None = None
    tokens_per_day: int | None = None
    url: str | None = None


class KeyRecord(Section):
    name: str
    created_at: FiniteFloat
    revoked_at: Finite = None
    rpm: int | None = None
    tokens_per_day: int | None = None
    requests: int = 0
    tokens_today: int = 0
    last_used: Finite = None
    requests_last_minute: int = 0


class KeyList(Section):
    keys: list[KeyRecord] = Field(default_factory=list)


class KeyRevoked(Section):
    name: str
    revoked: bool


# -- audit, alerts


class AuditEntry(Section):
    id: int
    t: FiniteFloat
    who: str
    role: str
    method: str
    params: str | None = None  # JSON, cut
    outcome: str  # ok, or the error code
    message: str | None = None
    duration_s: Finite = None
    key: str | None = None


class AuditRefusal(Section):
    minute: FiniteFloat
    who: str
    role: str
    method: str
    count: int
    key: str | None = None


class AuditList(Section):
    machine: str
    total: int = 0
    entries: list[AuditEntry] = Field(default_factory=list)
    refusals: list[AuditRefusal] = Field(default_factory=list)


class AlertList(Section):
    machine: str
    alerts: list[AlertInfo] = Field(default_factory=list)


# ============================================================================ the catalogue


@dataclass(frozen=True)
class Method(Generic[P, R]):
    """One RPC method: its name, what it takes, what it answers, who may call it."""

    name: str
    params: type[P]
    result: type[R]
    role: Role = Role.VIEWER
    doc: str = ""


OP = Role.OPERATOR

HELLO = Method("hello", NoParams, Hello, doc="Versions, capabilities and the caller's role. Call it first.")
PING = Method("ping", NoParams, Ping, doc="Round trip; returns the agent's clock.")
STATUS = Method("status", NoParams, StatusReply, doc="The latest sample and every section, whole.")
HISTORY = Method("history", HistoryParams, HistoryReply, doc="Samples from the one-hour ring buffer.")
SUBSCRIBE = Method("subscribe", SubscribeParams, Topics, doc="Push events: tick (state diffs), log, notice.")
UNSUBSCRIBE = Method("unsubscribe", SubscribeParams, Topics, doc="Stop pushing these events to this connection.")
SET_INTERVAL = Method("set_interval", IntervalParams, Interval, OP, "Change the sampling interval (not kept across restarts).")
METHODS = Method("methods", NoParams, MethodList, doc="Every method with its role and doc.")
SIM_OVERRIDE = Method("sim.override", OverrideParams, SimOverride, OP,
                      "Simulated GPUs only: force temp_c / util_pct / mem_used_bytes / power_w of one GPU (clear: true drops them).")

JOBS_RECIPES = Method("jobs.recipes", NoParams, RecipeList, doc="The recipes of this machine with their launch params.")
JOBS_LIST = Method("jobs.list", JobListParams, JobList, doc="Jobs, newest first: the active ones and recent history.")
JOBS_GET = Method("jobs.get", JobParams, JobDetail, doc="One job, with its command line and last log lines.")
JOBS_START = Method("jobs.start", StartParams, JobDetail, OP, "Launch a recipe with validated params.")
JOBS_STOP = Method("jobs.stop", StopParams, JobInfo, OP, "SIGTERM to the job's process group; SIGKILL after grace_s.")
JOBS_KILL = Method("jobs.kill", JobParams, JobInfo, OP, "SIGKILL to the job's process group now.")
JOBS_LOGS = Method("jobs.logs", LogsParams, JobLogs, doc="Log lines: the tail, or from an offset; follow pushes `log` events.")
JOBS_NODE_START = Method("jobs.node_start", NodeStartParams, NodeStatus, OP,
                         "Start this machine's node of a multi-node recipe named in this agent's own lab.yaml.")
JOBS_NODE_STOP = Method("jobs.node_stop", NodeStopParams, NodeStatus, OP, "Stop or kill this machine's node of a multi-node job.")
JOBS_NODE_STATUS = Method("jobs.node_status", NodeStatusParams, NodeStatus, OP, "This machine's node of a multi-node job.")

MODELS_LIST = Method("models.list", NoParams, ModelsList, doc="Every model of this machine with its state and figures, and the rotation plan.")
MODELS_GET = Method("models.get", ModelParams, ModelDetail, doc="One model with its history, load phases and log tail.")
MODELS_WARM = Method("models.warm", ModelParams, ModelInfo, OP, "Bring a model up (or wake it); returns at once.")
MODELS_SLEEP = Method("models.sleep", ModelParams, ModelInfo, OP, "Put a warm model to sleep (GPU freed, weights in RAM).")
MODELS_COLD = Method("models.cold", ModelParams, ModelInfo, OP, "Stop a model's engine; waits until it is stopped.")
MODELS_SWAP = Method("models.swap", SwapParams, SwapResult, OP, "Free OUT's GPUs and bring IN up there; returns at once.")
MODELS_CACHE = Method("models.cache", ModelParams, ModelInfo, OP, "Pre-read a model's files into RAM (page cache).")
MODELS_PIN = Method("models.pin", PinParams, ModelInfo, OP, "Pin (or unpin) a model: rotation never takes it out.")
MODELS_ROTATION = Method("models.rotation", NoParams, Rotation, doc="The rotation plan, the next rotation time and the measured overhead.")
MODELS_ROTATE = Method("models.rotate", NoParams, Rotation, OP, "Run the next rotation of the plan now; returns at once.")
MODELS_ADAPTER = Method("models.adapter", AdapterParams, AdapterLoaded, OP,
                        "Load a LoRA adapter into a warm vLLM (or sim) model; on llama.cpp, select one named at start.")

CHECKPOINTS_RUNS = Method("checkpoints.runs", NoParams, RunSummaryList,
                          doc="Every run with checkpoints on this machine: counts, best, disk, save-time share.")
CHECKPOINTS_LIST = Method("checkpoints.list", RunParams, RunCheckpoints, doc="One run's checkpoints (oldest first) and its loss curves.")
CHECKPOINTS_RESUME = Method("checkpoints.resume", ResumeParams, Resumed, OP, "A new job of the run's recipe, resuming from this checkpoint.")
CHECKPOINTS_SERVE = Method("checkpoints.serve", ServeParams, Served, OP, "Serve a checkpoint: adapter into a warm model, or as a new model.")
CHECKPOINTS_DELETE = Method("checkpoints.delete", DeleteParams, Deleted, OP,
                            "Delete one checkpoint (the best or newest only with confirm_special).")
CHECKPOINTS_KEEP = Method("checkpoints.keep", KeepParams, CheckpointInfo, OP, "Mark a checkpoint kept (prune never deletes it), or un-keep it.")
CHECKPOINTS_PRUNE = Method("checkpoints.prune", PruneParams, Pruned, OP, "Delete all but the best, the last N and the kept checkpoints.")

COSTS_GET = Method("costs.get", CostsParams, CostsReport,
                   doc="Energy and money of this machine: now, today, this month, since a date, by job or model.")

GATEWAY_STATUS = Method("gateway.status", NoParams, GatewayStatus, doc="The gateway's section: url, per-model traffic, provider spend, keys.")
GATEWAY_KEYS_ADD = Method("gateway.keys.add", KeyAddParams, KeyIssued, OP, "Issue a gateway API key; the token is shown once.")
GATEWAY_KEYS_LIST = Method("gateway.keys.list", NoParams, KeyList, doc="Gateway keys (names, quotas, use; never the tokens).")
GATEWAY_KEYS_REVOKE = Method("gateway.keys.revoke", KeyNameParams, KeyRevoked, OP, "Revoke a gateway key at once.")

NOTIFY_STATUS = Method("notify.status", NoParams, NotifyStatus,
                       doc="Each notification route of this machine: queued, delivered, failures, the last answers.")
NOTIFY_TEST = Method("notify.test", NotifyTestParams, TestResult, OP, "Send a test notification on a route now; answers what the endpoint said.")

AUDIT_LIST = Method("audit.list", AuditListParams, AuditList, OP,
                    "Operator actions on this agent, newest first (operators only: it names who did what).")
ALERTS_LIST = Method("alerts.list", AlertListParams, AlertList, doc="Alert history, newest first (active only with active: true).")
ALERTS_ACK = Method("alerts.ack", AckParams, AlertInfo, OP, "Acknowledge an alert: its badge goes, its history stays.")

GPUS_SUPPORT = Method("gpus.support", NoParams, GpuSupportSection,
                      doc="Which stacks (trainer torch, vLLM, llama-server) each GPU can run, with the reason and the fix.")

CATALOGUE: dict[str, Method[Any, Any]] = {m.name: m for m in (
    HELLO, PING, STATUS, HISTORY, SUBSCRIBE, UNSUBSCRIBE, SET_INTERVAL, METHODS, SIM_OVERRIDE,
    JOBS_RECIPES, JOBS_LIST, JOBS_GET, JOBS_START, JOBS_STOP, JOBS_KILL, JOBS_LOGS, JOBS_NODE_START, JOBS_NODE_STOP, JOBS_NODE_STATUS,
    MODELS_LIST, MODELS_GET, MODELS_WARM, MODELS_SLEEP, MODELS_COLD, MODELS_SWAP, MODELS_CACHE, MODELS_PIN, MODELS_ROTATION,
    MODELS_ROTATE, MODELS_ADAPTER,
    CHECKPOINTS_RUNS, CHECKPOINTS_LIST, CHECKPOINTS_RESUME, CHECKPOINTS_SERVE, CHECKPOINTS_DELETE, CHECKPOINTS_KEEP, CHECKPOINTS_PRUNE,
    COSTS_GET, GATEWAY_STATUS, GATEWAY_KEYS_ADD, GATEWAY_KEYS_LIST, GATEWAY_KEYS_REVOKE, NOTIFY_STATUS, NOTIFY_TEST,
    AUDIT_LIST, ALERTS_LIST, ALERTS_ACK, GPUS_SUPPORT,
)}


# ============================================================================ reading replies


class ReplyInvalid(RemoteError):
    """A reply that does not match its method's result model: which method, which field, what was wrong."""

    def __init__(self, method: str, field: str, problem: str, machine: str | None = None) -> None:
        said = f"{machine} answered {method} with a reply" if machine else f"{method} answered a reply"
        super().__init__(ErrorCode.INVALID_REPLY, f"{said} that does not fit at {field}: {problem}",
                         {"method": method, "field": field, **({"machine": machine} if machine else {})})
        self.method = method
        self.field = field
        self.machine = machine


def params_error(exc: ValidationError) -> str:
    """Params that do not validate, in words: each field and what is wrong with it (a name's rule, not its pattern)."""
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "params"
        if error["type"] == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == NAME_RE:
            parts.append(f"{where}: {error['input']!r} is not a name: {NAME_RULE}")  # not the regular expression
        else:
            parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(the reply)"


def validate_reply(method: Method[Any, R], raw: Any, machine: str | None = None) -> R:
    """The reply typed by the method's result model; ReplyInvalid (naming the machine that sent it, when given, the
    method and the field) otherwise."""
    try:
        return method.result.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        got = repr(first["input"])[:80] if first["type"] != "missing" else "nothing"
        raise ReplyInvalid(method.name, _where(first["loc"]), f"{first['msg']}, got {got}{more}", machine) from None


def parse_result(method_name: str, raw: Any) -> BaseModel:
    """A reply of the named method, typed; ReplyInvalid when it does not validate, KeyError for an unknown method."""
    return validate_reply(CATALOGUE[method_name], raw)


class Caller(Protocol):
    """What sends a request to one machine and waits for its raw reply (FleetClient, PeerClient)."""

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None,
                   timeout: float | None = None) -> Any: ...


def wire_params(params: BaseModel | None) -> dict[str, Any] | None:
    """Params as they travel: only what the caller set (an older agent refuses a field it does not know)."""
    if params is None:
        return None
    return params.model_dump(mode="json", by_alias=True, exclude_unset=True) or None


async def request(caller: Caller, machine: str, method: Method[P, R], params: P | None = None,
                  timeout: float | None = None) -> R:
    """Call ``method`` on ``machine`` and return its typed reply.

    Raises RemoteError (the agent's own, or timeout / disconnected), or ReplyInvalid when the reply does not
    validate against ``method.result``.
    """
    raw = await caller.call(machine, method.name, wire_params(params), timeout)
    return validate_reply(method, raw, machine)


async def request_all(caller: Caller, machines: Iterable[str], method: Method[P, R], params: P | None = None,
                      timeout: float | None = None) -> dict[str, R | RemoteError]:
    """``request`` on several machines at once: each machine's typed reply, or the RemoteError it gave (offline,
    refused, a reply that did not validate). Any other exception is a bug and is raised."""
    names = list(machines)
    replies = await asyncio.gather(*(request(caller, name, method, params, timeout) for name in names), return_exceptions=True)
    out: dict[str, R | RemoteError] = {}
    for name, reply in zip(names, replies):
        if isinstance(reply, BaseException) and not isinstance(reply, RemoteError):
            raise reply
        out[name] = reply
    return out
