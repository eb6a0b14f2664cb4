"""LabState: the one in-memory picture of the lab that screens, the CLI and tests read."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agents.lab import Lab, Machine

SPARK_POINTS = 120  # per GPU and host series: two minutes at 1 Hz


@dataclass
class MachineView:
    """What the console knows of one machine; plain data, updated by the FleetClient."""

    config: Machine
    link: str = "connecting"  # connecting | online | offline | refused | untrusted
    error: str | None = None
    last_seen: float | None = None  # wall time of the last message from the agent
    sample_t: float | None = None  # agent's time of the newest sample
    hello: dict[str, Any] | None = None
    sections: dict[str, Any] = field(default_factory=dict)
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    series: dict[str, deque] = field(default_factory=dict)  # "gpu0.util_pct" -> values
    version: int = 0  # bumped on every change; screens redraw what moved

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
    def host(self) -> dict[str, Any]:
        return self.sections.get("host") or {}

    def items(self, section: str) -> list[dict[str, Any]]:
        """A list section (jobs, models ...) as dicts, whether sent bare or as {section: [...]}."""
        value = self.sections.get(section)
        if isinstance(value, dict):
            value = value.get(section)
        return [item for item in value or [] if isinstance(item, dict)]

    def age_s(self, now: float | None = None) -> float | None:
        if self.sample_t is None:
            return None
        return max(0.0, (now or time.time()) - self.sample_t)

    def spark(self, key: str) -> list[float]:
        return [v for v in self.series.get(key, ()) if v is not None]

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

    def _bump(self, view: MachineView) -> None:
        view.version += 1
        self.version += 1

    def set_link(self, name: str, link: str, error: str | None = None) -> None:
        view = self.machines[name]
        if view.link != link or view.error != error:
            view.link, view.error = link, error
            self._bump(view)

    def set_hello(self, name: str, hello: dict[str, Any]) -> None:
        view = self.machines[name]
        view.hello = hello
        view.last_seen = time.time()
        self._bump(view)

    def apply_tick(self, name: str, data: dict[str, Any]) -> None:
        """Merge one tick (whole or a diff) into the machine's view."""
        view = self.machines[name]
        changed = dict(data.get("changed") or {})
        gpus = changed.pop("gpus", None) or []
        if data.get("full"):
            view.sections = {}
            view.gpus = {}
        view.sections.update(changed)
        for gpu in gpus:
            view.gpus[gpu["index"]] = gpu
        view.sample_t = data.get("t", view.sample_t)
        view.last_seen = time.time()
        for index, gpu in view.gpus.items():
            for key in ("util_pct", "mem_used_bytes", "temp_c", "power_w"):
                view._record(f"gpu{index}.{key}", gpu.get(key))
        view._record("cpu_pct", view.host.get("cpu_pct"))
        self._bump(view)

    def seed_history(self, name: str, history: dict[str, Any]) -> None:
        """Fill the sparklines from the agent's ring buffer, so a new console starts with a past."""
        view = self.machines[name]
        for gpu in history.get("gpus", []):
            for key in ("util_pct", "mem_used_bytes", "temp_c", "power_w"):
                series = view.series[f"gpu{gpu['index']}.{key}"] = deque(maxlen=SPARK_POINTS)
                series.extend(gpu.get(key, [])[-SPARK_POINTS:])
        cpu = view.series["cpu_pct"] = deque(maxlen=SPARK_POINTS)
        cpu.extend(history.get("host", {}).get("cpu_pct", [])[-SPARK_POINTS:])
        self._bump(view)

    def apply_status(self, name: str, status: dict[str, Any]) -> None:
        """A whole `status` answer, as the CLI gets it."""
        data = {"t": status.get("t"), "full": True, "changed": {k: v for k, v in status.items() if k not in ("t", "machine", "simulated")}}
        self.apply_tick(name, data)

    # -- lab-wide figures

    def gpu_totals(self) -> tuple[int, int]:
        """(GPU count, total VRAM bytes) over the machines seen so far."""
        count = total = 0
        for view in self.machines.values():
            for gpu in view.gpus.values():
                count += 1
                total += gpu.get("mem_total_bytes") or 0
        return count, total
