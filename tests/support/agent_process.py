"""Helpers for the hardening tests: small labs on free ports, agent processes with a chosen env, raw channels."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import asyncssh
import yaml

from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab, free_ports
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.waits import wait_until

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}
PY = sys.executable
SLEEPER = "import time\nfor i in range(100000):\n    print(f'step {i}', flush=True)\n    time.sleep(0.5)"


def one_machine_lab(path: Path, **extra) -> Path:
    """A lab with one simulated machine `box` on a free loopback port; extra top-level keys merged in."""
    data = {
        "lab": "hardening",
        "machines": [{"name": "box", "host": "127.0.0.1", "port": free_ports(1)[0], "gpus": {"sim": [P4, P4]}}],
        **extra,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_agent(
    lab_path: Path, state_dir: Path, *args: str, env: dict[str, str] | None = None, log_level: str = "warning"
) -> subprocess.Popen:
    """`cetlab-agent serve` for machine box as a real process, in its own session."""
    return subprocess.Popen(
        agent_argv(python_agent(PY), lab_path, "box", state_dir, log_level=log_level, extra=args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def wait_listening(host: str, port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    def listens() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the agent exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_until(listens, timeout, what=f"something listening on {host}:{port}")


async def connected(lab_path: Path, timeout: float = 20.0, **kwargs) -> FleetClient:
    client = FleetClient(load_lab(lab_path), **kwargs)
    await client.start()
    await client.wait_connected(timeout)
    return client


async def raw_channel(demo: DemoLab, machine: str = "box", key: str | None = None):
    """(conn, writer, reader) of one bare SSH channel on subsystem cetlab, as the demo console's key (or another)."""
    lab = load_lab(demo.lab_path)
    m = lab.machine(machine)
    conn = await asyncssh.connect(
        m.host,
        m.port,
        username="cetlab",
        client_keys=[key or str(lab.resolve(lab.console.key))],
        known_hosts=str(lab.resolve(lab.console.known_hosts)),
        agent_path=None,
        config=None,
    )
    writer, reader, _ = await conn.open_session(subsystem="cetlab", encoding=None)
    return conn, writer, reader


async def next_reply(reader, timeout: float = 10.0) -> dict:
    """The next response line (events skipped)."""
    while True:
        line = await within(reader.readline(), timeout)
        if not line:
            raise ConnectionError("the agent closed the channel")
        message = json.loads(line)
        if "event" not in message:
            return message
