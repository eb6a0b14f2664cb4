"""Day one on a real lab: one machine, its agent a real process from a fresh state dir, the gateway on that machine.

The gateway answers its first request for a model of its own machine with no peer key, no authorization of it and
no known_hosts entry; a model on a machine it cannot reach fails at once, saying why and what fixes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import openai
import pytest
import yaml

from agents.shell.demo.lab import free_ports
from agents.wire.agent_argv import agent_argv, python_agent
from tests.support.agent_process import start_agent, wait_listening

pytestmark = pytest.mark.timeout(120)


PY = sys.executable


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


SIM = {"load_s": 0.2, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1, "tokens_per_s": 0, "placeholder_mib": 1}


def write_lab(root: Path, machines: list[dict], models: list[dict]) -> tuple[Path, int]:
    """A lab.yaml of these machines with the gateway on the first, and a console key authorized on it as operator."""
    agent_port, gateway_port = free_ports(2)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="day-one-console")
    (root / "console").mkdir()
    key.write_private_key(root / "console" / "id_ed25519")
    (root / "console" / "id_ed25519").chmod(0o600)
    key.write_public_key(root / "console" / "id_ed25519.pub")
    machines[0] = {**machines[0], "host": "127.0.0.1", "port": agent_port}
    data = {
        "lab": "day-one",
        "console": {"key": "console/id_ed25519", "known_hosts": "console/known_hosts"},
        "machines": machines,
        "models": models,
        "gateway": {"machine": machines[0]["name"], "host": "127.0.0.1", "port": gateway_port},
    }
    lab = root / "lab.yaml"
    lab.write_text(yaml.safe_dump(data, sort_keys=False))
    return lab, gateway_port


def agent_cli(*args: str) -> str:
    return subprocess.run([PY, "-m", "agents.shell.daemon", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def cetlab(lab: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "console.cli.main", "--lab", str(lab), *args], capture_output=True, text=True, timeout=60)


def serve(root: Path, lab: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The agent of `box` from a fresh state dir, reachable by the console (its host key, the console's key)."""
    state = root / "state"
    host_key = agent_cli("host-key", "--machine", "box", "--state-dir", str(state)).strip()
    agent_cli(
        "authorize", "--machine", "box", "--state-dir", str(state), "--role", "operator", str(root / "console" / "id_ed25519.pub")
    )
    port = yaml.safe_load(lab.read_text())["machines"][0]["port"]
    (root / "console" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    proc = start_agent(lab, state)
    wait_listening("127.0.0.1", port, proc)
    return proc, state


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)


def gateway_key(lab: Path) -> str:
    added = cetlab(lab, "--json", "gateway", "keys", "add", "day-one")
    assert added.returncode == 0, added.stderr
    return json.loads(added.stdout)["key"]


def test_the_gateway_serves_its_own_machines_model_with_no_peer_link(tmp_path):
    model = {"name": "tiny", "path": "models/tiny", "engine": "sim", "machine": "box", "gpus": [0], "vram_gib": 1, "sim": SIM}
    lab, gateway_port = write_lab(tmp_path, [{"name": "box", "gpus": {"sim": [P4]}}], [model])
    proc, state = serve(tmp_path, lab)
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=gateway_key(lab), max_retries=0, timeout=60
        )
        started = time.monotonic()
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert reply.choices[0].message.content, reply
        assert time.monotonic() - started < 60
        listed = {m.id: m for m in client.models.list().data}
        assert listed["tiny"].model_extra["state"] == "warm"
        status = cetlab(lab, "gateway")
        assert status.returncode == 0 and "not reachable" not in status.stdout, status.stdout
        # no SSH to itself: no peer key was made, no known_hosts needed
        assert not (state / "peer_ed25519_key").exists()
        assert not (state / "peer_known_hosts").exists()
    finally:
        stop(proc)


def test_a_model_on_a_machine_the_gateway_cannot_reach_fails_at_once_with_the_fix(tmp_path):
    far_port = free_ports(1)[0]
    model = {"name": "far", "path": "models/far", "engine": "sim", "machine": "node", "gpus": [0], "vram_gib": 1, "sim": SIM}
    machines = [
        {"name": "box", "gpus": {"sim": [P4]}},
        {"name": "node", "host": "127.0.0.1", "port": far_port, "gpus": {"sim": [P4]}},
    ]
    lab, gateway_port = write_lab(tmp_path, machines, [model])
    # node's agent runs, but the gateway has neither its host key nor an authorization there
    node_state = tmp_path / "node-state"
    node = subprocess.Popen(
        agent_argv(python_agent(PY), lab, "node", node_state, log_level="warning"),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    proc, _state = serve(tmp_path, lab)
    try:
        wait_listening("127.0.0.1", far_port, node)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=gateway_key(lab), max_retries=0, timeout=60
        )
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="far", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
        assert time.monotonic() - started < 30  # not the 120 s queue timeout
        error = caught.value
        assert error.status_code == 503
        message = error.body["message"] if isinstance(error.body, dict) else str(error.body)
        assert "node" in message and "untrusted" in message, message
        assert "peer_known_hosts" in message and "cetlab-agent host-key --machine node" in message, message
        assert error.response.headers.get("retry-after")
    finally:
        stop(proc)
        stop(node)
