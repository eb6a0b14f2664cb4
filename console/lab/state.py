"""LabState: the one in-memory picture of the lab that screens, the CLI and tests read."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agents.runtime.view import GPU_SERIES, SPARK_POINTS, LabView
from agents.wire.lab.model import Lab
from agents.wire.lab.push import file_version
from agents.wire.protocol import LinkStatus
from agents.wire.sections.alerts import alert_id
from agents.wire.sections.base import SectionFault

if TYPE_CHECKING:
    from agents.wire.catalogue.agent import HistoryReply


# a link in these states is not an outage (yet): it never was up, or it is up
_NOT_DOWN = (LinkStatus.ONLINE, LinkStatus.CONNECTING)


class LabState(LabView):
    """The client core's per-machine views (agents/runtime/view.py) and what only a console keeps: the cleared offline
    alerts, and lab-wide figures."""

    def __init__(self, lab: Lab):
        super().__init__(lab)
        # offline alerts that cleared: only the console raises them, so only it can keep their history (newest last)
        self.offline_history: deque[dict[str, Any]] = deque(maxlen=200)
        # the version of the workstation's lab.yaml as read: a machine that runs another is flagged (`cetlab lab push`)
        self.lab_version = file_version(lab)

    def set_link(self, name: str, link: LinkStatus, error: str | None = None) -> None:
        view = self.machines[name]
        if link == LinkStatus.ONLINE and view.link not in _NOT_DOWN and view.last_seen is not None:
            now = time.time()
            if now - view.last_seen >= self.lab.alerts.offline_for_s:  # it was an alert: it clears now, into the history
                self.offline_history.append(
                    {
                        "id": f"{alert_id(name, 'offline')}-{int(view.last_seen)}",
                        "rule": "offline",
                        "level": "critical",
                        "machine": name,
                        "target": "machine",
                        "message": f"{name} was {view.link}" + (f": {view.error}" if view.error else ""),
                        "fired_at": view.last_seen,
                        "cleared_at": now,
                        "acked_at": None,
                    }
                )
        super().set_link(name, link, error)

    def seed_history(self, name: str, history: HistoryReply) -> None:
        """Fill the sparklines from the agent's ring buffer, so a new console starts with a past."""
        view = self.machines[name]
        for gpu in history.gpus:
            for key in GPU_SERIES:
                series = view.series[f"gpu{gpu.index}.{key}"] = deque(maxlen=SPARK_POINTS)
                series.extend(getattr(gpu, key)[-SPARK_POINTS:])
        cpu = view.series["cpu_pct"] = deque(maxlen=SPARK_POINTS)
        cpu.extend(history.host.cpu_pct[-SPARK_POINTS:])
        view.touch("series")
        self.bump(view)

    def sections_version(self, parts: Iterable[str]) -> int:
        """A number that moves exactly when one of these parts changed on any machine (a sum of counters that only grow)."""
        names = tuple(parts)
        return sum(view.section_versions.get(name, 0) for view in self.machines.values() for name in names)

    def faults(self, sections: Iterable[str] | None = None) -> list[tuple[str, SectionFault]]:
        """(machine, fault) of every section failing now on an online machine, or refused here as it sent it (only these
        sections, when given)."""
        wanted = None if sections is None else set(sections)
        return [
            (view.name, fault)
            for view in self.machines.values()
            if view.online
            for fault in view.section_faults()
            if wanted is None or fault.section in wanted
        ]

    # -- lab-wide figures

    def gpu_memory(self) -> dict[str, dict[int, int]]:
        """Each machine's GPUs seen so far, index -> total bytes (a failed or unreported one left out): where a model
        fits (agents/wire/vram_fit.py)."""
        return {
            name: {i: g.mem_total_bytes for i, g in view.gpus.items() if g.mem_total_bytes and not g.failed}
            for name, view in self.machines.items()
        }

    def gpu_totals(self) -> tuple[int, int]:
        """(GPU count, total VRAM bytes) over the machines seen so far."""
        count = total = 0
        for view in self.machines.values():
            for gpu in view.gpus.values():
                count += 1
                total += gpu.mem_total_bytes or 0
        return count, total
