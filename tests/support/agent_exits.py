"""What tests/e2e/shell/test_hostile_files.py, tests/e2e/shell/test_wiring.py share: wait_exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.agent_process import (
    connected,
    start_agent,
    wait_listening,
)


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


async def _ran_once(lab_path: Path, state: Path) -> None:
    """Start the agent, make one operator action (a row in the trail), stop it."""
    proc = start_agent(lab_path, state)
    port = yaml.safe_load(lab_path.read_text())["machines"][0]["port"]
    try:
        wait_listening("127.0.0.1", port, proc)
        client = await connected(lab_path)
        try:
            await client.call("box", "set_interval", {"interval_s": 1.0})
        finally:
            await client.stop()
    finally:
        proc.terminate()
        assert wait_exit(proc, 30) == 0
