"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: tick."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.wire.protocol import GpuList, HostSample, Telemetry
from agents.wire.sections.alerts import AlertsSection
from agents.wire.sections.audit import AuditSection
from agents.wire.sections.base import FaultsSection, GpuStatus
from agents.wire.sections.checkpoints import RunSummary
from agents.wire.sections.costs import CostsSummary
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.gpu_support import GpuSupportSection
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.lab import LabSection
from agents.wire.sections.models import ModelInfo, ModelsSection
from agents.wire.sections.queue import QueueSection

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
    "lab": LabSection | None,
    "queue": QueueSection | None,  # on the lab queue's machine only
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
