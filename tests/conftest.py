"""Shared fixtures: the demo lab's real agents on loopback, a connected FleetClient."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from console.demo import DemoLab

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def demo_lab(tmp_path_factory) -> DemoLab:
    """The bundled demo lab, its four agents running as real processes (shared by tests)."""
    with DemoLab(tmp_path_factory.mktemp("demo")) as demo:
        yield demo


@pytest.fixture
def lab_file(tmp_path):
    """Write a small lab.yaml (one sim machine by default); returns a function (data) -> Path."""

    def write(data: dict | None = None, name: str = "lab.yaml") -> Path:
        data = data or {
            "lab": "test-lab",
            "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        }
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture
def small_demo(tmp_path, lab_file):
    """A one-machine lab with its agent running; yields the DemoLab (restartable agents)."""
    with DemoLab(tmp_path / "run", source=lab_file()) as demo:
        yield demo


def run_agent(lab_path: Path, machine: str, state_dir: Path) -> subprocess.Popen:
    """Start `cetlab-agent serve` as a real process (for kill/restart tests)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agents.daemon", "--log-level", "warning", "serve", "--lab", str(lab_path),
         "--machine", machine, "--state-dir", str(state_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll until predicate() is truthy (a coroutine function is awaited); fail with a clear message on timeout.

    Returns the predicate's truthy value. Every wait in the tests goes through here: no sleeps, no
    hand-made deadline loops, no pauses that hope the console has caught up.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(interval)


def drawn(app, kind: type | None = None) -> bool:
    """The console shows a view (of this kind) that has drawn the newest LabState."""
    from console.screens.base import LabScreen

    screen = app.screen
    return (isinstance(screen, LabScreen) and (kind is None or isinstance(screen, kind)) and screen.ready
            and screen.drawn_version == app.state.version)


async def until_drawn(pilot, kind: type | None = None, timeout: float = 20.0) -> None:
    """Wait until the view (of this kind) has drawn the newest data, then let Textual finish the frame."""
    await wait_for(lambda: drawn(pilot.app, kind), timeout)
    await pilot.pause()  # no delay: only the messages already queued (the redraw) run
