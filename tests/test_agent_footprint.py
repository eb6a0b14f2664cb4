"""The agent imports only what its machine's lab.yaml uses (issue 22: its RSS against an nvitop-style loop).

Each case builds a real Agent (its default components, not started) in a fresh interpreter and reads that
interpreter's sys.modules: an import made at module level anywhere in the agent shows up here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU = "{sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}"
MACHINES = f"machines: [{{name: hub, gpus: {GPU}}}, {{name: box, gpus: {GPU}}}]\n"

# what a machine without the gateway, a multi-node job or a llama.cpp build never needs in the agent's process
NEVER_HERE = ("agents.gateway.component", "agents.gateway.router", "agents.gateway.metering", "agents.gateway.server",
              "agents.peers", "agents.link", "aiohttp", "prometheus_client", "tarfile", "logging.handlers", "platformdirs",
              "torch", "numpy", "textual", "rich")

PROBE = """
import json, sys
from pathlib import Path
from agents.lab import load_lab
from agents.agent import Agent
import agents.daemon  # the entry point's own imports count too
agent = Agent(load_lab(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
print(json.dumps({"components": [c.name for c in agent.components], "modules": sorted(sys.modules)}))
"""


def built(tmp_path: Path, gateway: str, machine: str) -> tuple[list[str], set[str]]:
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab: t\n" + gateway + MACHINES)
    out = subprocess.run([sys.executable, "-c", PROBE, str(lab), machine, str(tmp_path / "state")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    return answer["components"], set(answer["modules"])


def test_an_agent_without_the_gateway_imports_none_of_it(tmp_path):
    for gateway, machine in (("", "box"), ("gateway: {machine: hub}\n", "box")):
        components, modules = built(tmp_path, gateway, machine)
        assert "gateway" not in components
        assert {"jobs", "models", "checkpoints", "notify", "costs", "alerts", "audit"} <= set(components)
        assert not modules & set(NEVER_HERE), f"{gateway or 'no gateway'}, machine {machine}: imported {sorted(modules & set(NEVER_HERE))}"


def test_the_gateways_machine_builds_the_gateway(tmp_path):
    components, modules = built(tmp_path, "gateway: {machine: hub}\n", "hub")
    assert components[-1] == "gateway"  # last: it reads the other components' state
    assert "agents.gateway.component" in modules
