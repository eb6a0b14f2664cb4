"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: agent."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, NoParams, Params, Root
from agents.wire.protocol import (
    Finite,
    FiniteFloat,
    GpuSample,
    Hello,
    HistoryParams,
    HostSample,
    IntervalParams,
    Role,
    SubscribeParams,
)
from agents.wire.sections.alerts import AlertsSection
from agents.wire.sections.audit import AuditSection
from agents.wire.sections.base import FaultsSection, GpuStatus, Section
from agents.wire.sections.checkpoints import RunSummary
from agents.wire.sections.costs import CostsSummary
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.gpu_support import GpuSupportSection
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.lab import LabSection
from agents.wire.sections.models import ModelsSection
from agents.wire.sections.queue import QueueSection


class OverrideParams(Params):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: int = Field(ge=0)
    temp_c: float | None = Field(default=None, ge=-50, le=200)
    util_pct: float | None = Field(default=None, ge=0, le=100)
    mem_used_bytes: int | None = Field(default=None, ge=0, le=2**50)
    power_w: float | None = Field(default=None, ge=0, le=10_000)
    clear: bool = False  # drop this GPU's overrides first (alone: back to the simulation)


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
    lab: LabSection | None = None
    queue: QueueSection | None = None  # on the lab queue's machine only
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


class MethodList(Root):
    model_config = ConfigDict(defer_build=True)

    root: list[MethodInfo]


class SimOverride(Section):
    gpu: int
    overrides: dict[str, float | int] = Field(default_factory=dict)
    simulated: bool = True


HELLO = Method("hello", NoParams, Hello, doc="Versions, capabilities and the caller's role. Call it first.")


PING = Method("ping", NoParams, Ping, doc="Round trip; returns the agent's clock.")


STATUS = Method("status", NoParams, StatusReply, doc="The latest sample and every section, whole.")


HISTORY = Method("history", HistoryParams, HistoryReply, doc="Samples from the one-hour ring buffer.")


SUBSCRIBE = Method("subscribe", SubscribeParams, Topics, doc="Push events: tick (state diffs), log, notice.")


UNSUBSCRIBE = Method("unsubscribe", SubscribeParams, Topics, doc="Stop pushing these events to this connection.")


SET_INTERVAL = Method("set_interval", IntervalParams, Interval, OP, "Change the sampling interval (not kept across restarts).")


METHODS = Method("methods", NoParams, MethodList, doc="Every method with its role and doc.")


SIM_OVERRIDE = Method(
    "sim.override",
    OverrideParams,
    SimOverride,
    OP,
    "Simulated GPUs only: force temp_c / util_pct / mem_used_bytes / power_w of one GPU (clear: true drops them).",
)


GPUS_SUPPORT = Method(
    "gpus.support",
    NoParams,
    GpuSupportSection,
    doc="Which stacks (trainer torch, vLLM, llama-server) each GPU can run, with the reason and the fix.",
)
