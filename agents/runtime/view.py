"""The typed picture a client keeps of each machine: its link status, its last tick's sections, the data's age.

One ``MachineView`` per machine, built by the client core (agents/runtime/link.py) from the agent's hello and ticks,
each section parsed once into its model (agents/wire/sections/) where it enters. The console's LabState, the CLI
and the gateway router all read these views: ``view.link`` is a ``LinkStatus``, ``view.models`` a
``ModelsSection`` of ``ModelInfo`` with ``ModelState``, never dicts with string states.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agents.wire.events import TickEvent
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab
from agents.wire.protocol import GpuSample, Hello, HostSample, LinkStatus
from agents.wire.sections.alerts import AlertsSection
from agents.wire.sections.audit import AuditSection
from agents.wire.sections.base import FaultsSection, GpuStatus, SectionFault
from agents.wire.sections.checkpoints import RunSummary
from agents.wire.sections.costs import CostsSummary
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.gpu_support import GpuSupportSection
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.lab import LabSection
from agents.wire.sections.models import ModelInfo, ModelsSection
from agents.wire.sections.queue import QueueSection
from agents.wire.sections.tick import SECTION_MODELS
from agents.wire.states import JOB_HOLDS_GPU, MODEL_ENGINE_UP

log = logging.getLogger("cetlab.view")

SPARK_POINTS = 120  # per GPU and host series: two minutes at 1 Hz
GPU_SERIES = ("util_pct", "mem_used_bytes", "temp_c", "power_w")
_SECTIONS: dict[
    str, TypeAdapter[Any]
] = {}  # built once each, on first use: parsing is the 1 Hz path, and `cetlab status` needs three


def _adapter(name: str) -> TypeAdapter[Any] | None:
    adapter = _SECTIONS.get(name)
    if adapter is None and name in SECTION_MODELS:
        adapter = _SECTIONS[name] = TypeAdapter(SECTION_MODELS[name])
    return adapter


def _gpu_of(key: str) -> int | None:
    """The GPU index of a series key ("gpu3.util_pct" -> 3); None for a host series."""
    head = key.partition(".")[0].removeprefix("gpu")
    return int(head) if head.isdigit() else None


@dataclass
class MachineView:
    """What a client knows of one machine; plain typed data, updated by the client core."""

    config: Machine
    link: LinkStatus = LinkStatus.CONNECTING
    error: str | None = None
    last_seen: float | None = None  # wall time of the last message from the agent
    sample_t: float | None = None  # agent's time of the newest sample
    hello: Hello | None = None  # what the agent said of itself on connecting
    # the tick's sections, each parsed once into its model (agents/wire/sections/) where it enters
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
    lab: LabSection | None = None  # the lab.yaml it runs (its version; None: an agent older than `cetlab lab push`)
    queue: QueueSection | None = None  # on the lab queue's machine only (agents/scheduler/)
    problems: dict[str, str] = field(default_factory=dict)  # section -> why the agent's last value of it was refused
    refused: dict[str, SectionFault] = field(default_factory=dict)  # the same, shown as a failing section is (section_faults)
    series: dict[str, deque[Any]] = field(default_factory=dict)  # "gpu0.util_pct" -> values
    version: int = 0  # bumped on every change; screens redraw what moved
    # per section (and "link", "hello", "series"): bumped only when that part changed, so a view redraws what it shows
    section_versions: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def online(self) -> bool:
        return self.link is LinkStatus.ONLINE

    @property
    def simulated(self) -> bool:
        return bool(self.hello and self.hello.simulated) or self.config.simulated

    @property
    def lab_version(self) -> str | None:
        """The version of the lab.yaml it runs: its last tick's, else its hello's (None: an older agent, or not yet)."""
        if self.lab is not None:
            return self.lab.version
        return self.hello.lab_version if self.hello is not None else None

    def lab_differs(self, workstation: str | None) -> bool:
        """It runs another lab.yaml than ``workstation`` (the version of the console's file); unknown is no difference."""
        return workstation is not None and self.lab_version is not None and self.lab_version != workstation

    @property
    def agent_version(self) -> str | None:
        """The cetlab version the agent said in its hello (None before it answered)."""
        return self.hello.agent_version if self.hello is not None else None

    def lacking(self) -> dict[str, list[str]]:
        """What this client's catalogue has that the agent does not serve, by the verb a user would use (an older agent)."""
        from agents.wire.catalogue.index import CATALOGUE  # deferred: the catalogue's models, not on a cold CLI's import path
        from agents.wire.catalogue.verbs import lacking

        if self.hello is None or self.hello.methods is None:
            return {}
        return lacking(self.hello.methods, CATALOGUE)

    @property
    def model_list(self) -> list[ModelInfo]:
        """The models of this machine's pool (none when it has no models section)."""
        return self.models.models if self.models else []

    def model(self, name: str) -> ModelInfo | None:
        """One model of this machine's pool, as its last tick (or listing) said; None when it does not list it."""
        return next((m for m in self.model_list if m.name == name), None)

    def set_link(self, status: LinkStatus, error: str | None = None) -> bool:
        """The link's status and why; True when that changed."""
        if self.link is status and self.error == error:
            return False
        self.link, self.error = status, error
        self.touch("link")
        return True

    def clear_sections(self) -> None:
        """A full tick follows: forget every section."""
        fresh = MachineView(self.config)
        self.gpus, self.host, self.gpu_status, self.jobs = {}, fresh.host, None, []
        self.models, self.checkpoints, self.costs, self.alerts, self.audit = None, [], None, fresh.alerts, fresh.audit
        self.gateway = None
        self.queue = None
        self.gpu_support = None
        self.faults = fresh.faults
        self.lab = None
        self.problems, self.refused = {}, {}

    def apply_section(self, name: str, value: Any) -> None:
        """Parse one section of a tick into its model; a value that does not fit is refused, named, and logged."""
        adapter = _adapter(name)
        if adapter is None:
            return  # a section this client does not know (a newer agent): ignored, as extra keys are
        try:
            parsed = adapter.validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join([name, *(str(part) for part in first["loc"])])
            self.problems[name] = f"{self.name} sent a {name} section that does not fit: {where}: {first['msg']}"
            log.warning("%s", self.problems[name])
            before = self.refused.get(name)
            fault = SectionFault(
                section=name, phase="refused", error=self.problems[name], since=before.since if before else time.time()
            )
            if fault != before:
                self.refused[name] = fault
                self.touch("faults")  # the views showing faults redraw: what they show of this section is stale
            return
        self.problems.pop(name, None)
        if self.refused.pop(name, None) is not None:
            self.touch("faults")
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

    def apply_tick(self, tick: TickEvent) -> None:
        """Merge one tick (whole or a diff) into this view."""
        if tick.full:
            self.clear_sections()
            self.touch(*SECTION_MODELS)  # whatever was shown may be gone
        for section, value in tick.changed.items():
            self.apply_section(section, value)
        self.sample_t = tick.t
        self.last_seen = time.time()
        if tick.full:  # the GPUs a full tick no longer lists are gone: so are their series
            for key in [k for k in self.series if k.startswith("gpu") and _gpu_of(k) not in self.gpus]:
                del self.series[key]
        for index, gpu in self.gpus.items():
            for key in GPU_SERIES:
                self.record(f"gpu{index}.{key}", getattr(gpu, key))
        self.record("cpu_pct", self.host.cpu_pct)
        self.touch("series")

    def touch(self, *parts: str) -> None:
        """Note that these sections (or "link", "hello", "series") changed: the views showing them redraw."""
        for part in parts:
            self.section_versions[part] = self.section_versions.get(part, 0) + 1

    def failed(self, section: str) -> SectionFault | None:
        """The agent's fault on this section now, or this client's refusal of what the agent sent of it (its value
        here is the last one before either), or None."""
        return self.faults.of(section) or self.refused.get(section)

    def section_faults(self) -> list[SectionFault]:
        """The sections whose value here is stale: failing on the agent, or refused as sent (it did not fit its model)."""
        return [*self.faults.failed, *(fault for name, fault in self.refused.items() if self.faults.of(name) is None)]

    def age_s(self, now: float | None = None) -> float | None:
        """How old the newest sample is, in seconds (None before the first)."""
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

    def record(self, key: str, value: Any) -> None:
        """Append one point to a sparkline series (the last SPARK_POINTS are kept)."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = deque(maxlen=SPARK_POINTS)
        series.append(value)


class LabView:
    """The views of the machines one client links to, and a lab-wide version that moves with any of them."""

    def __init__(self, lab: Lab, machines: Iterable[str] | None = None):
        self.lab = lab
        wanted = set(machines) if machines is not None else None
        self.machines: dict[str, MachineView] = {
            m.name: MachineView(m) for m in lab.machines if wanted is None or m.name in wanted
        }
        self.version = 0

    def bump(self, view: MachineView) -> None:
        view.version += 1
        self.version += 1

    def set_link(self, name: str, link: LinkStatus, error: str | None = None) -> None:
        view = self.machines[name]
        if view.set_link(LinkStatus(link), error):
            self.bump(view)

    def set_hello(self, name: str, hello: Hello) -> None:
        view = self.machines[name]
        view.hello = hello
        view.last_seen = time.time()
        view.touch("hello")
        self.bump(view)

    def apply_tick(self, name: str, tick: TickEvent | Mapping[str, Any]) -> None:
        """Merge one tick (whole or a diff; typed where it entered, or its JSON) into the machine's view."""
        view = self.machines[name]
        view.apply_tick(tick if isinstance(tick, TickEvent) else TickEvent.model_validate(tick))
        self.bump(view)

    def apply_status(self, name: str, status: Mapping[str, Any]) -> None:
        """A whole `status` answer, as the CLI gets it."""
        changed = {k: v for k, v in status.items() if k not in ("t", "machine", "simulated")}
        self.apply_tick(name, TickEvent.model_validate({"t": status.get("t"), "full": True, "changed": changed}))

    def apply_models(self, name: str, listing: ModelsSection) -> None:
        """A fresh `models.list` answer (typed where it entered): the models as they are now, not as the last tick said."""
        view = self.machines[name]
        section = ModelsSection(models=listing.models, rotation=listing.rotation)
        if view.models != section:
            view.models = section
            view.touch("models")
        self.bump(view)
