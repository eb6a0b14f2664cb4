"""`cetlab lab push` on two real agents on loopback, started from a lab file with fresh state dirs (no demo set-up).

The console holds its own key (operator on both) and both agents' host keys, nothing else; hub's own lab.yaml does not
name node yet. After one push the gateway on `hub` reaches the model on `node` (no peer key authorized by hand, no
peer known_hosts line written by hand, no restart); a
second push changes a gateway policy and the running gateway enforces it, the warm engine still warm; a push with an
error is refused at its line and column and nothing changes; rollback puts the previous lab.yaml back.
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

from agents.runtime.keys import AUTHORIZED_KEYS_NAME
from agents.runtime.labfile import PUSHED_NAME
from agents.runtime.peers import PEER_KNOWN_HOSTS_NAME
from agents.shell.demo.lab import free_ports
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.push import lab_version
from tests.support.agent_process import wait_listening
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(240)


PY = sys.executable


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


SIM = {"load_s": 0.2, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1, "tokens_per_s": 0, "placeholder_mib": 1}


REACH_S = 90  # the gateway's peer link retries with a backoff of up to 15 s: it is trusted at its next attempt


def agent_cli(*args: str) -> str:
    return subprocess.run([PY, "-m", "agents.shell.daemon", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def cetlab(lab: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "console.cli.main", "--lab", str(lab), *args], capture_output=True, text=True, timeout=90)


def lab_data(ports: dict[str, int], gateway_port: int, policies: dict | None = None) -> dict:
    return {
        "lab": "pushed",
        "console": {"key": "console/id_ed25519", "known_hosts": "console/known_hosts"},
        "machines": [
            {"name": "hub", "host": "127.0.0.1", "port": ports["hub"], "gpus": "none"},
            {"name": "node", "host": "127.0.0.1", "port": ports["node"], "gpus": {"sim": [P4]}},
        ],
        "models": [
            {"name": "far", "path": "models/far", "engine": "sim", "machine": "node", "gpus": [0], "vram_gib": 1, "sim": SIM}
        ],
        "gateway": {"machine": "hub", "host": "127.0.0.1", "port": gateway_port, "policies": policies or {}},
    }


def write(lab: Path, data: dict) -> str:
    text = yaml.safe_dump(data, sort_keys=False)
    lab.write_text(text)
    return text


def start(root: Path, lab: Path, machine: str, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    """The agent of one machine from a fresh state dir and its own --lab file: its host key pinned by the console, the
    console's key authorized as operator."""
    state = root / f"state-{machine}"
    host_key = agent_cli("host-key", "--machine", machine, "--state-dir", str(state)).strip()
    agent_cli(
        "authorize",
        "--machine",
        machine,
        "--state-dir",
        str(state),
        "--role",
        "operator",
        str(root / "console" / "id_ed25519.pub"),
    )
    with (root / "console" / "known_hosts").open("a") as f:
        f.write(f"[127.0.0.1]:{port} {host_key}\n")
    proc = subprocess.Popen(
        agent_argv(python_agent(PY), lab, machine, state, log_level="warning"),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    wait_listening("127.0.0.1", port, proc)
    return proc, state


def chat(client: openai.OpenAI, max_tokens: int = 4) -> str:
    reply = client.chat.completions.create(model="far", messages=[{"role": "user", "content": "hello"}], max_tokens=max_tokens)
    return reply.choices[0].message.content or ""


def answered(client: openai.OpenAI) -> str | None:
    """The model's answer through the gateway, or None while the gateway says it cannot reach `node` yet (a 503)."""
    try:
        return chat(client)
    except openai.APIStatusError as exc:
        if exc.status_code != 503:
            raise
        return None


def wait_answered(client: openai.OpenAI, timeout: float) -> str:
    return wait_until(lambda: answered(client), timeout, what="the gateway reaching node's model after the push")


def pushed(lab: Path, *args: str) -> dict:
    done = cetlab(lab, "--json", "lab", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_one_push_makes_the_peers_and_a_second_changes_a_gateway_policy_live(tmp_path):
    hub_port, node_port, gateway_port = free_ports(3)
    ports = {"hub": hub_port, "node": node_port}
    (tmp_path / "console").mkdir()
    key = asyncssh.generate_private_key("ssh-ed25519", comment="push-console")
    key.write_private_key(tmp_path / "console" / "id_ed25519")
    (tmp_path / "console" / "id_ed25519").chmod(0o600)
    key.write_public_key(tmp_path / "console" / "id_ed25519.pub")
    lab = tmp_path / "lab.yaml"
    first = write(lab, lab_data(ports, gateway_port))
    # hub's own lab.yaml predates node (a machine added since): the gateway alone, no models, no peers
    alone = lab_data(ports, gateway_port)
    alone.update(machines=alone["machines"][:1], models=[])
    write(tmp_path / "hub-lab.yaml", alone)
    node, node_state = start(tmp_path, lab, "node", node_port)
    hub, hub_state = start(tmp_path, tmp_path / "hub-lab.yaml", "hub", hub_port)
    try:
        # no hand-made peer trust anywhere: one authorized key (the console's) per agent, no peer known hosts
        assert not (hub_state / PEER_KNOWN_HOSTS_NAME).exists()
        assert (node_state / AUTHORIZED_KEYS_NAME).read_text().count("\n") == 1
        added = cetlab(lab, "--json", "gateway", "keys", "add", "push-test")
        assert added.returncode == 0, added.stderr
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=json.loads(added.stdout)["key"], max_retries=0, timeout=60
        )

        started = time.monotonic()
        one = pushed(lab, "push")

        assert one["hub"]["peer_hosts"] == 2 and one["node"]["authorized"] == ["gateway@hub"], one
        assert "machines: +node" in one["hub"]["live"] and "models: +far" in one["hub"]["live"] and one["hub"]["restart"] == []
        assert one["node"]["version"] == lab_version(first) and not one["node"]["changed"]
        assert wait_answered(client, REACH_S)
        print(f"push to the first answer through the peer: {time.monotonic() - started:.1f} s")
        assert chat(client, max_tokens=16)

        # a gateway policy, live: requests above the new max_tokens are refused by the running gateway
        second = write(lab, lab_data(ports, gateway_port, {"max_tokens": 8}))
        two = pushed(lab, "push")
        assert two["hub"]["live"] == ["gateway"] and two["hub"]["restart"] == [] and two["hub"]["version"] == lab_version(second)
        with pytest.raises(openai.BadRequestError) as refused:
            chat(client, max_tokens=16)
        assert "8" in str(refused.value.body), refused.value.body
        assert chat(client, max_tokens=4)
        listed = {m.id: m for m in client.models.list().data}
        assert listed["far"].model_extra["state"] == "warm"  # the engine on node served on through both pushes

        # a push with an error: refused at its line and column by the agent that runs the model, nothing changes
        bad = lab_data(ports, gateway_port, {"max_tokens": 8})
        bad["models"][0]["engine"] = "no-such-engine"
        bad_text = write(lab, bad)
        refused_push = cetlab(lab, "lab", "push")
        assert refused_push.returncode == 1
        line = next(n for n, text in enumerate(bad_text.splitlines(), 1) if "no-such-engine" in text)
        assert f"lab.yaml:{line}:" in refused_push.stdout, refused_push.stdout
        assert (node_state / PUSHED_NAME).read_text() == second
        status = json.loads(cetlab(lab, "--json", "status").stdout)
        versions = {m["name"]: (m["lab_version"], m["lab_differs"]) for m in status["machines"]}
        assert versions["node"] == (lab_version(second), True)  # the workstation's file is the bad one now

        # rollback: the lab.yaml before the last push, its policy enforced again
        write(lab, lab_data(ports, gateway_port, {"max_tokens": 8}))
        back = pushed(lab, "rollback")
        assert {r["version"] for r in back.values()} == {lab_version(first)}
        assert chat(client, max_tokens=16)
        status = json.loads(cetlab(lab, "--json", "status").stdout)
        assert all(m["lab_version"] == lab_version(first) and m["lab_differs"] for m in status["machines"])
    finally:
        for proc in (hub, node):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
