"""Shared helpers for the benchmarks: percentiles, CPU share of a process over a window, the venv's commands."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent


def this_checkout_first() -> None:
    """Child processes (agents, the CLI, loops) import this checkout's code, not the one the venv was installed from."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in paths if p != str(REPO)]])


def console_script(name: str) -> str:
    """The path of one of cetlab's commands beside the running Python: `make bench` does not put .venv/bin on PATH."""
    path = Path(sys.executable).parent / name  # not resolved: a venv's python is a link out of the venv
    if not path.is_file():
        raise SystemExit(f"{name} is not beside {sys.executable}: install cetlab into this Python (pip install -e '.[train]')")
    return str(path)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


class CpuWindow:
    """CPU seconds a process used over wall seconds: its share of one core.

    On Linux from the scheduler's own account of every thread (/proc/PID/task/*/schedstat, nanoseconds): psutil's
    cpu_times count in clock ticks (10 ms), too coarse for a process that needs 2 ms a second (0.05% steps in 20 s).
    """

    def __init__(self, pid: int | None = None):
        self.proc = psutil.Process(pid)
        self.start()

    def cpu_s(self) -> float:
        try:
            total = 0
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                try:
                    total += int((task / "schedstat").read_text().split()[0])
                except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                    continue
            return total / 1e9
        except (FileNotFoundError, NotADirectoryError, ValueError, IndexError):  # not Linux, or no schedstat
            times = self.proc.cpu_times()
            return times.user + times.system

    def start(self) -> None:
        self.cpu0, self.wall0 = self.cpu_s(), time.monotonic()

    def share_pct(self) -> float:
        return (self.cpu_s() - self.cpu0) / (time.monotonic() - self.wall0) * 100


class DrawnAges:
    """The age of the data on the screen: at each paint of a machine card's GPU lines, the console's clock minus the
    agent's sample time of the tick that card shows (not of the newest tick that arrived).

    For the bench process only, and nothing in cetlab changes for it: wraps Textual's `Static.render_lines` (what the
    compositor calls to paint a widget) to see the cards' GPU lines painted, and the app's `LabState.apply_tick` to
    learn which sample time each machine's state version carries. `close()` takes both away.
    """

    def __init__(self, app: Any) -> None:
        from textual.geometry import Region
        from textual.strip import Strip
        from textual.widget import Widget
        from textual.widgets import Static

        from widgets.machine_card import MachineCard

        self.app: Any = app
        self.ages: list[float] = []  # at each paint of a card's GPU lines
        self.on_screen: list[float] = []  # the same, sampled on a clock over the cards in view (a card never repainted ages too)
        self._sample_t: dict[str, dict[int, float]] = {}
        state = app.state
        apply_tick = state.apply_tick

        def applied(name: str, data: dict[str, Any]) -> None:
            apply_tick(name, data)
            view = state.machines[name]
            if view.sample_t is not None:
                self._sample_t.setdefault(name, {})[view.version] = view.sample_t

        state.apply_tick = applied
        render_lines = Static.render_lines
        probe = self

        def painted(static: Widget, crop: Region) -> list[Strip]:
            card = static.parent
            if isinstance(card, MachineCard) and static.has_class("card-gpus"):
                age = probe.age(card.machine, card.shown_version)
                if age is not None:
                    probe.ages.append(age)
            return render_lines(static, crop)

        Static.render_lines = painted  # the bench's probe, taken away by close()

        def unwrap() -> None:
            Static.render_lines = render_lines
            del state.apply_tick

        self._unwrap = unwrap

    def age(self, machine: str, version: int | None) -> float | None:
        if version is None:
            return None
        known = self._sample_t.get(machine, {})
        for v in range(version, version - 8, -1):  # a link or hello change bumps the version, no new sample
            if v in known:
                return max(0.0, self.app.clock() - known[v])
        return None

    async def watch(self, every_s: float = 0.25) -> None:
        """Until cancelled: every `every_s`, the age of what each card in view shows (into `on_screen`)."""
        import asyncio

        while True:
            await asyncio.sleep(every_s)
            screen = self.app.screen
            for card in getattr(screen, "cards", []):
                if card.shown_version is not None and screen.region.overlaps(card.region):
                    age = self.age(card.machine, card.shown_version)
                    if age is not None:
                        self.on_screen.append(age)

    def clear(self) -> None:
        self.ages.clear()
        self.on_screen.clear()

    def close(self) -> None:
        self._unwrap()


class EngineSessions:
    """HTTP sessions that reach engines directly at their endpoints (each its unix socket, or 127.0.0.1:PORT where
    lab.yaml put it on a port), for the benches' "direct" figures: ``sessions(endpoint)`` is (session, its /v1 URL)."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def __call__(self, endpoint: str) -> tuple[Any, str]:
        import aiohttp

        from agents.wire.engine_address import EngineAddress

        address = EngineAddress.parse(endpoint)
        if endpoint not in self._open:
            connector = aiohttp.UnixConnector(path=address.socket, limit=0) if address.socket else aiohttp.TCPConnector(limit=0)
            self._open[endpoint] = aiohttp.ClientSession(connector=connector)
        return self._open[endpoint], f"{address.origin}/v1"

    async def close(self) -> None:
        for session in self._open.values():
            await session.close()
