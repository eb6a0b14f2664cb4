"""The wire contract between consoles and agents: message shapes, snapshots, error codes.

JSON lines over one SSH session channel (subsystem ``cetlab``):

    request   {"id": 1, "method": "hello", "params": {...}}
    response  {"id": 1, "result": {...}}   or   {"id": 1, "error": {"code": "...", "message": "..."}}
    event     {"event": "tick", "data": {...}}

Units are in the field names: bytes, seconds, watts, percent, degrees Celsius.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from agents.wire.schema import Topic

PROTOCOL_VERSION = 1
SUBSYSTEM = "cetlab"
# One JSON line may not exceed this; larger requests get TOO_LARGE and are discarded.
MAX_MESSAGE_BYTES = 1024 * 1024
# No reply or event line is larger than this (long answers are cut and say so); consoles read lines up to it.
MAX_REPLY_BYTES = 8 * 1024 * 1024
MAX_GPUS = 64  # GPUs one machine may report (indices 0..63)
MAX_TOPICS = 16  # per subscribe call (there are three topics)
SSH_USERNAME = "cetlab"


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    GATEWAY = "gateway"  # the lab gateway's key: reads, and may call GATEWAY_METHODS only
    NODE = "node"  # a multi-node job's coordinating agent: NODE_METHODS only, not even reads
    SCHEDULER = "scheduler"  # the lab queue's agent: reads, and may call SCHEDULER_METHODS only

    def allows(self, needed: Role, method: str = "") -> bool:
        if self is Role.NODE:
            return method in NODE_METHODS
        if self is Role.OPERATOR or needed is Role.VIEWER:
            return True
        return (self is Role.GATEWAY and method in GATEWAY_METHODS) or (self is Role.SCHEDULER and method in SCHEDULER_METHODS)


# What the gateway role may do beyond reading: bring models up and take them down, nothing else.
GATEWAY_METHODS = frozenset({"models.warm", "models.sleep", "models.swap", "models.cold"})
# What the scheduler role may do beyond reading: start and stop the jobs it placed, and put models aside for them.
SCHEDULER_METHODS = frozenset({"jobs.start", "jobs.stop", "models.warm", "models.sleep", "models.cold"})
# What the node role may do: start, stop and report this machine's node of a multi-node recipe, or its rpc-server for a
# model spread over it, as its own lab.yaml names them.
NODE_METHODS = frozenset(
    {"hello", "jobs.node_start", "jobs.node_stop", "jobs.node_status", "models.rpc_start", "models.rpc_stop", "models.rpc_status"}
)


class LinkStatus(StrEnum):
    """A client's link to one agent (the console's, the CLI's, a peer agent's): one state machine for all of them."""

    CONNECTING = "connecting"  # the first attempt has not ended yet
    ONLINE = "online"  # hello answered, subscribed: calls go through
    OFFLINE = "offline"  # no connection now; retried with backoff
    REFUSED = "refused"  # the agent (or its sshd) refused our key or role: retried slowly, the fix is on that machine
    UNTRUSTED = "untrusted"  # its host key is not in our known_hosts (or changed): retried slowly, never trusted silently


class ErrorCode(StrEnum):
    PARSE_ERROR = "parse_error"  # not JSON, or not UTF-8
    INVALID_REQUEST = "invalid_request"  # JSON, but not a request object
    TOO_LARGE = "too_large"  # line longer than MAX_MESSAGE_BYTES
    METHOD_NOT_FOUND = "method_not_found"
    INVALID_PARAMS = "invalid_params"
    FORBIDDEN = "forbidden"  # the caller's role may not call this method
    NOT_FOUND = "not_found"  # unknown job / model / checkpoint ...
    MODEL_FILE_MISSING = "model_file_missing"  # a model's weights are not at its path on its machine (the fix is said)
    CONFLICT = "conflict"  # GPUs taken, model already warm elsewhere ...
    UNAVAILABLE = "unavailable"  # not supported on this machine, engine down ...
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"  # client side: no answer in time
    DISCONNECTED = "disconnected"  # client side: the machine is offline
    INVALID_REPLY = "invalid_reply"  # client side: the reply does not match the method's result model (agents/wire/catalogue/)
    INTERNAL = "internal"  # a bug in the agent; details are in its log, never on the wire


class RemoteError(Exception):
    """A typed error, raised by handlers and re-raised on the client side."""

    def __init__(self, code: ErrorCode | str, message: str, data: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        self.message = message
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": str(self.code), "message": self.message}
        if self.data:
            error["data"] = self.data
        return error

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def encode(message: dict[str, Any]) -> bytes:
    """One message as a JSON line."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False, default=str).encode() + b"\n"


# ---------------------------------------------------------------------------- numbers


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite number is "no value"."""
    return value if value is None or math.isfinite(value) else None


# Every float that may travel on the wire has one of these types:
# Finite turns NaN and +-inf into null where they enter; FiniteFloat (for required figures such as times) refuses them.
Finite = Annotated[float | None, AfterValidator(finite_or_none)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


# ---------------------------------------------------------------------------- snapshots


class Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class GpuProcess(Snapshot):
    pid: int
    user: str | None = None
    command: str | None = None
    mem_used_bytes: int | None = None


class ComputeCapability(Snapshot):
    """A GPU's CUDA compute capability (6.1 for a Tesla P40): which kernels (sm_61) can run on it."""

    major: int = Field(ge=1, le=99)
    minor: int = Field(ge=0, le=9)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def number(self) -> int:
        """61 for 6.1: the form of torch's arch list."""
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


class GpuSample(Snapshot):
    """One GPU at one instant. ``None`` means N/A (unsupported by this GPU or driver)."""

    index: int = Field(ge=0, lt=MAX_GPUS)  # bounded: a client keeps a series per index
    name: str
    uuid: str | None = None
    util_pct: Finite = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: Finite = None
    power_w: Finite = None
    power_limit_w: Finite = None
    fan_pct: Finite = None
    sm_clock_mhz: int | None = None
    processes: list[GpuProcess] = Field(default_factory=list)
    failed: str | None = None  # why this GPU stopped reporting (e.g. "GPU is lost")
    simulated: bool = False
    compute_capability: ComputeCapability | None = None  # NVML's, or the sim spec's (simulated: true); None: N/A


class HostSample(Snapshot):
    cpu_pct: Finite = None
    cpu_count: int | None = None
    load_1: Finite = None
    load_5: Finite = None
    load_15: Finite = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    disk_path: str | None = None
    disk_used_bytes: int | None = None
    disk_total_bytes: int | None = None
    net_rx_bytes_per_s: Finite = None
    net_tx_bytes_per_s: Finite = None


GpuBackend = Literal["nvml", "sim", "none"]  # the GPU sampler of a machine (agents/telemetry)


# a tick's GPUs: at most one per index (a hostile agent's thousands are refused where they enter)
GpuList = Annotated[list[GpuSample], Field(max_length=MAX_GPUS)]


class Telemetry(Snapshot):
    """Everything sampled on one machine in one tick."""

    machine: str
    t: FiniteFloat  # unix time of the sample
    gpus: GpuList = Field(default_factory=list)
    host: HostSample = Field(default_factory=HostSample)
    gpu_backend: GpuBackend = "none"
    gpu_status: str | None = None  # e.g. "no NVIDIA GPUs: NVML library not found"
    simulated: bool = False


class PeerKeys(Snapshot):
    """An agent's public client keys (``ssh-ed25519 AAAA... comment``), as ``lab push`` authorizes them on the others:
    ``peer`` (the gateway's calls and tunnels) and ``node`` (a multi-node job's coordinator); None: not made here."""

    peer: Annotated[str, Field(max_length=1000)] | None = None
    node: Annotated[str, Field(max_length=1000)] | None = None
    scheduler: Annotated[str, Field(max_length=1000)] | None = None  # the lab queue's calls (its jobs' starts)

    @property
    def made(self) -> bool:
        """Whether this agent has any key for the others to authorize."""
        return bool(self.peer or self.node or self.scheduler)


class Hello(Snapshot):
    protocol: int
    agent_version: str
    machine: str
    lab: str
    role: Role
    capabilities: list[str]
    simulated: bool
    sample_interval_s: float
    started_at: float
    lab_version: str | None = None  # the short hash of the lab.yaml text it runs (None: an older agent)
    peer_keys: PeerKeys | None = None  # the keys the lab's other agents authorize (`cetlab lab push`)
    # every method its version's catalogue has (served here or not: the gateway's only where it runs); None: an older agent
    methods: list[Annotated[str, Field(max_length=100)]] | None = Field(default=None, max_length=2000)


# ---------------------------------------------------------------------------- methods


class HistoryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: float | None = None  # unix time; None = the whole ring buffer
    max_points: int = Field(default=3600, ge=1, le=3600)


class IntervalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(ge=0.1, le=60)


class SubscribeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topics: list[Topic] = Field(default_factory=lambda: ["tick"], max_length=MAX_TOPICS)

    @field_validator("topics")
    @classmethod
    def _known_topics(cls, topics: list[str]) -> list[str]:
        unknown = sorted({t[:40] for t in topics} - SUBSCRIBABLE)
        if unknown:  # a peer's topic set only ever holds known names: bounded memory per console
            raise ValueError(f"unknown topics {', '.join(map(repr, unknown[:3]))} (known: {', '.join(sorted(SUBSCRIBABLE))})")
        return topics


# Events pushed by the agent.
EVENT_TICK = "tick"  # data: {"t", "changed": {section: value}} only what changed since the last tick
EVENT_LOG = "log"  # data: {"job", "lines"}
EVENT_NOTICE = "notice"  # data: {"level", "message"} (alerts, state changes worth a toast)
SUBSCRIBABLE = frozenset(
    {EVENT_TICK, EVENT_LOG, EVENT_NOTICE}
)  # `subscribe` takes these; `log:<job>` comes with jobs.logs follow
