"""Shared fixtures: the demo lab's real agents on loopback, a connected FleetClient."""

from __future__ import annotations

import asyncio
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
    """Poll until predicate() is truthy; fail the test with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s: {getattr(predicate, '__name__', predicate)}")
