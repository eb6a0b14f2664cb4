"""The agent imports only what its machine's lab.yaml uses (issue 22: its RSS against an nvitop-style loop).

Each case builds a real Agent (its default components, not started) in a fresh interpreter and reads that
interpreter's sys.modules: an import made at module level anywhere in the agent shows up here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


GPU = "{sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}"


MACHINES = f"machines: [{{name: hub, gpus: {GPU}}}, {{name: box, gpus: {GPU}}}]\n"


# what a machine without the gateway, a multi-node job or a llama.cpp build never needs in the agent's process
NEVER_HERE = (
    "agents.gateway.component",
    "agents.gateway.router",
    "agents.gateway.metering",
    "agents.gateway.server",
    "agents.runtime.peers",
    "agents.runtime.link",
    "aiohttp",
    "prometheus_client",
    "tarfile",
    "logging.handlers",
    "platformdirs",
    "torch",
    "numpy",
    "textual",
    "rich",
)


PROBE = """
import json, sys
from pathlib import Path
from agents.wire.lab.model import load_lab
from agents.shell.agent import Agent
import agents.shell.daemon  # the entry point's own imports count too
agent = Agent(load_lab(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
print(json.dumps({"components": [c.name for c in agent.components], "modules": sorted(sys.modules)}))
"""


SERVED = """
import asyncio, json, sys
from pathlib import Path
from agents.wire.lab.model import load_lab
from agents.shell.agent import Agent
import agents.shell.daemon

async def main():
    agent = Agent(load_lab(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), unix_socket=Path(sys.argv[4]))
    await agent.start()
    try:
        reader, writer = await asyncio.open_unix_connection(sys.argv[4])
        writer.write(b'{"id": 1, "method": "hello", "params": {}}\\n')
        reply = json.loads(await reader.readline())
        writer.close()
    finally:
        await agent.stop()
    print(json.dumps({"reply": reply, "modules": sorted(sys.modules)}))

asyncio.run(main())
"""


def built(tmp_path: Path, gateway: str, machine: str) -> tuple[list[str], set[str]]:
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab: t\n" + gateway + MACHINES)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(lab), machine, str(tmp_path / "state")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    return answer["components"], set(answer["modules"])


def test_an_agent_without_the_gateway_imports_none_of_it(tmp_path):
    for gateway, machine in (("", "box"), ("gateway: {machine: hub}\n", "box")):
        components, modules = built(tmp_path, gateway, machine)
        assert "gateway" not in components
        assert {"jobs", "models", "checkpoints", "notify", "costs", "alerts", "audit"} <= set(components)
        assert not modules & set(NEVER_HERE), (
            f"{gateway or 'no gateway'}, machine {machine}: imported {sorted(modules & set(NEVER_HERE))}"
        )


def test_the_gateways_machine_builds_the_gateway(tmp_path):
    components, modules = built(tmp_path, "gateway: {machine: hub}\n", "hub")
    assert components[-1] == "gateway"  # last: it reads the other components' state
    assert "agents.gateway.component" in modules


def test_a_via_sshd_agent_serves_its_socket_without_the_ssh_stack(tmp_path):
    """Its consoles come through the machine's sshd: no SSH server of its own, so neither asyncssh nor cryptography (~15 MB)."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(f"lab: t\nmachines: [{{name: box, via: sshd, gpus: {GPU}}}]\n")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a unix socket's path has at most 107 bytes
        out = subprocess.run(
            [sys.executable, "-c", SERVED, str(lab), "box", str(tmp_path / "state"), f"{short}/agent.sock"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["reply"]["id"] == 1 and answer["reply"]["result"]["role"] == "operator"  # the agent's own user
    modules = set(answer["modules"])
    assert not modules & {"asyncssh", "cryptography", "agents.shell.server", *NEVER_HERE}, sorted(
        modules & {"asyncssh", "cryptography", "agents.shell.server"}
    )


def test_doctor_asks_no_host_key_of_a_via_sshd_agent(tmp_path):
    from agents.shell.doctor import OK, WARN, check_state_dir

    tmp_path.chmod(0o700)
    by_name = {c.name: c for c in check_state_dir(tmp_path, ssh_server=False)}
    assert by_name["host key"].level == OK and "via: sshd" in by_name["host key"].message
    assert {c.name: c for c in check_state_dir(tmp_path)}["host key"].level == WARN  # its own SSH port: made at the first start
