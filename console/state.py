"""LabState: the one in-memory picture of the lab that screens, the CLI and tests read."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from pydantic import TypeAdapter, ValidationError

from agents.sections_gpu_support import GpuSupportSection
from agents.lab import Lab, Machine
from agents.protocol import GpuSample, HostSample
from agents.sections import (
    SECTION_MODELS,
    AlertsSection,
    AuditSection,
    CostsSummary,
    GatewaySection,
    GpuStatus,
    JobInfo,
    ModelInfo,
    ModelsSection,
    FaultsSection,
    RunSummary,
    SectionFault,
    alert_id,
)
from agents.states import JOB_HOLDS_GPU, MODEL_ENGINE_UP

log = logging.getLogger("cetlab.state")

SPARK_POINTS = 120  # per GPU and host series: two minutes at 1 Hz
GPU_SERIES = ("util_pct", "mem_used_bytes", "temp_c", "power_w")
_SECTIONS: dict[str, TypeAdapter] = {}  # built once each, on first use: parsing is the 1 Hz path, and `cetlab status` needs three


def _adapter(name: str) -> TypeAdapter | None:
    adapter = _SECTIONS.get(name)
    if adapter is None and name in SECTION_MODELS:
        adapter = _SECTIONS[name] = TypeAdapter(SECTION_MODELS[name])
    return adapter


@dataclass
class MachineView:
    """What the console knows of one machine; plain data, updated by the FleetClient."""

    config: Machine
    link: str = "connecting"  # connecting | online | offline | refused | untrusted
    error: str | None = None
    last_seen: float | None = None  # wall time of the last message from the agent
    sample_t: float | None = None  # agent's time of the newest sample
    hello: dict[str, Any] | None = None
    # the tick's sections, each parsed once into its model (agents/sections.py) where it enters
    gpus: dict[int, GpuSample] = field(default_factory=dict)
    host: HostSample = field(default_factory=HostSample)
    gpu_status: GpuStatus | None = None
    jobs: list[JobInfo] = field(default_factory=list)
    models: ModelsSection | None = None
    checkpoints: list[RunSummary] = field(default_factory=list)
    costs: CostsSummary | None = None
    alerts: AlertsSection = field(default_factory=AlertsSection)
    audit: AuditSection = field(default_factory=AuditSection)
    gateway: GatewaySection | None = None  # on the gateway's machine only
    gpu_support: GpuSupportSection | None = None  # which stacks each GPU can run (agents/gpusupport/)
    faults: FaultsSection = field(default_factory=FaultsSection)  # sections whose component fails now (their last value is stale)
    problems: dict[str, str] = field(default_factory=dict)  # section -> why the agent's last value of it was refused
    series: dict[str, deque] = field(default_factory=dict)  # "gpu0.util_pct" -> values
    version: int = 0  # bumped on every change; screens redraw what moved
    # per section (and "link", "hello", "series"): bumped only when that part changed, so a view redraws what it shows
    section_versions: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def online(self) -> bool:
        return self.link == "online"

    @property
    def simulated(self) -> bool:
        return bool(self.hello and self.hello.get("simulated")) or self.config.simulated

    @property
    def model_list(self) -> list[ModelInfo]:
        """The models of this machine's pool (none when it has no models section)."""
        return self.models.models if self.models else []

    def clear_sections(self) -> None:
        """A full tick follows: forget every section."""
        fresh = MachineView(self.config)
        self.gpus, self.host, self.gpu_status, self.jobs = {}, fresh.host, None, []
        self.models, self.checkpoints, self.costs, self.alerts, self.audit = None, [], None, fresh.alerts, fresh.audit
        self.gateway = None
        self.gpu_support = None
        self.faults = fresh.faults
        self.problems = {}

    def apply_section(self, name: str, value: Any) -> None:
        """Parse one section of a tick into its model; a value that does not fit is refused, named, and logged."""
        adapter = _adapter(name)
        if adapter is None:
            return  # a section this console does not know (a newer agent): ignored, as extra keys are
        try:
            parsed = adapter.validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join([name, *(str(part) for part in first["loc"])])
            self.problems[name] = f"{self.name} sent a {name} section that does not fit: {where}: {first['msg']}"
            log.warning("%s", self.problems[name])
            return
        self.problems.pop(name, None)
        if name == "gpus":
            changed = False
            for gpu in parsed:
                changed = changed or self.gpus.get(gpu.index) != gpu
                self.gpus[gpu.index] = gpu
        elif name == "host":
            parsed = parsed or HostSample()
            changed = self.host != parsed
            self.host = parsed
        else:
            changed = getattr(self, name) != parsed
            setattr(self, name, parsed)
        if changed:
            self.touch(name)

    def touch(self, *parts: str) -> None:
        """Note that these sections (or "link", "hello", "series") changed: the views showing them redraw."""
        for part in parts:
            self.section_versions[part] = self.section_versions.get(part, 0) + 1

    def failed(self, section: str) -> SectionFault | None:
        """The agent's fault on this section now (its value here is the last one before it failed), or None."""
        return self.faults.of(section)

    def age_s(self, now: float | None = None) -> float | None:
        if self.sample_t is None:
            return None
        return max(0.0, (now or time.time()) - self.sample_t)

    def spark(self, key: str) -> list[float]:
        return [v for v in self.series.get(key, ()) if v is not None]

    def gpu_owners(self) -> dict[int, str]:
        """Which job or model holds each GPU, from the agent's jobs and models sections."""
        owners: dict[int, list[str]] = {}
        for job in self.jobs:
            if job.state in JOB_HOLDS_GPU:
                for index in job.gpus:
                    owners.setdefault(index, []).append(f"job {job.id} {job.recipe}")
        for model in self.model_list:
            if model.state in MODEL_ENGINE_UP:  # a sleeping engine still owns its GPU's place
                for index in model.gpus:
                    owners.setdefault(index, []).append(f"model {model.name} ({model.state})")
        return {index: ", ".join(names) for index, names in owners.items()}

    def _record(self, key: str, value: Any) -> None:
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = deque(maxlen=SPARK_POINTS)
        series.append(value)


class LabState:
    def __init__(self, lab: Lab):
        self.lab = lab
        self.machines: dict[str, MachineView] = {m.name: MachineView(m) for m in lab.machines}
        self.version = 0
        # offline alerts that cleared: only the console raises them, so only it can keep their history (newest last)
        self.offline_history: deque[dict[str, Any]] = deque(maxlen=200)

    def _bump(self, view: MachineView) -> None:
        view.version += 1
        self.version += 1

    def set_link(self, name: str, link: str, error: str | None = None) -> None:
        view = self.machines[name]
        if link == "online" and view.link not in ("online", "connecting") and view.last_seen is not None:
            now = time.time()
            if now - view.last_seen >= self.lab.alerts.offline_for_s:  # it was an alert: it clears now, into the history
                self.offline_history.append({
                    "id": f"{alert_id(name, 'offline')}-{int(view.last_seen)}", "rule": "offline", "level": "critical", "machine": name,
                    "target": "machine", "message": f"{name} was {view.link}" + (f": {view.error}" if view.error else ""),
                    "fired_at": view.last_seen, "cleared_at": now, "acked_at": None})
        if view.link != link or view.error != error:
            view.link, view.error = link, error
            view.touch("link")
            self._bump(view)

    def set_hello(self, name: str, hello: dict[str, Any]) -> None:
        view = self.machines[name]
        view.hello = hello
        view.last_seen = time.time()
        view.touch("hello")
        self._bump(view)

    def apply_tick(self, name: str, data: dict[str, Any]) -> None:
        """Merge one tick (whole or a diff) into the machine's view."""
        view = self.machines[name]
        if data.get("full"):
            view.clear_sections()
            view.touch(*SECTION_MODELS)  # whatever was shown may be gone
        for section, value in (data.get("changed") or {}).items():
            view.apply_section(section, value)
        view.sample_t = data.get("t", view.sample_t)
        view.last_seen = time.time()
        for index, gpu in view.gpus.items():
            for key in GPU_SERIES:
                view._record(f"gpu{index}.{key}", getattr(gpu, key))
        view._record("cpu_pct", view.host.cpu_pct)
        view.touch("series")
        self._bump(view)

    def seed_history(self, name: str, history: dict[str, Any]) -> None:
        """Fill the sparklines from the agent's ring buffer, so a new console starts with a past."""
        view = self.machines[name]
        for gpu in history.get("gpus", []):
            for key in GPU_SERIES:
                series = view.series[f"gpu{gpu['index']}.{key}"] = deque(maxlen=SPARK_POINTS)
                series.extend(gpu.get(key, [])[-SPARK_POINTS:])
        cpu = view.series["cpu_pct"] = deque(maxlen=SPARK_POINTS)
        cpu.extend(history.get("host", {}).get("cpu_pct", [])[-SPARK_POINTS:])
        view.touch("series")
        self._bump(view)

    def apply_status(self, name: str, status: dict[str, Any]) -> None:
        """A whole `status` answer, as the CLI gets it."""
        data = {"t": status.get("t"), "full": True, "changed": {k: v for k, v in status.items() if k not in ("t", "machine", "simulated")}}
        self.apply_tick(name, data)

    def sections_version(self, parts: Iterable[str]) -> int:
        """A number that moves exactly when one of these parts changed on any machine (a sum of counters that only grow)."""
        names = tuple(parts)
        return sum(view.section_versions.get(name, 0) for view in self.machines.values() for name in names)

    def faults(self, sections: Iterable[str] | None = None) -> list[tuple[str, SectionFault]]:
        """(machine, fault) of every section failing now on an online machine (only these sections, when given)."""
        wanted = None if sections is None else set(sections)
        return [(view.name, fault) for view in self.machines.values() if view.online
                for fault in view.faults.failed if wanted is None or fault.section in wanted]

    # -- lab-wide figures

    def gpu_totals(self) -> tuple[int, int]:
        """(GPU count, total VRAM bytes) over the machines seen so far."""
        count = total = 0
        for view in self.machines.values():
            for gpu in view.gpus.values():
                count += 1
                total += gpu.mem_total_bytes or 0
        return count, total
