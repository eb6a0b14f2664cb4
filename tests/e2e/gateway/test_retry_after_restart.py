"""The gateway's first request after a peer agent restarted with its engines: answered, not a 502.

The agent on `node` restarts (systemd's restart of an agent with --keep-engines): its engine keeps serving and the new
agent re-adopts it, and the gateway's SSH forward to it is made anew. The gateway had a connection to that engine open
from the last request, through the old forward; a request sent on it fails before any byte of an answer came back
("Server disconnected"). The gateway looks again and sends it once more, on a fresh connection.
"""

from __future__ import annotations

import signal
import subprocess

import aiohttp
import pytest
import yaml

from agents.runtime.keys import open_private_log
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(180)


SIM = {"load_s": 0.05, "cold_factor": 1, "warmup_s": 0.05, "wake_s": 0.05, "tokens_per_s": 0, "placeholder_mib": 1}


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


LAB = {
    "lab": "retry-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4]}}],
    "models": [
        {"name": "solo", "path": "models/solo", "engine": "sim", "machine": "node", "gpus": [0], "vram_gib": 1, "sim": SIM}
    ],
    "orchestra": {"warm": ["solo"]},
    "gateway": {"machine": "hub"},
}


def restart_agent(demo: DemoLab, machine: str) -> None:
    """Stop the machine's agent process (its engines stay: --keep-engines) and start it again with the same command."""
    proc = demo.agent_process(machine)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) is not None
    log = open_private_log(demo.dir / "agents" / f"{machine}.log")
    demo.replace_agent(
        machine, subprocess.Popen(proc.args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    )
    log.close()


@pytest.fixture
def demo(tmp_path):
    source = tmp_path / "src" / "lab.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(LAB, sort_keys=False))
    with DemoLab(tmp_path / "demo", source=source, keep_engines=True) as lab:
        yield lab


async def test_the_first_request_after_a_peer_agent_restarted_with_its_engines_is_answered(demo):
    lab = load_lab(demo.lab_path)
    key = (demo.dir / "console" / "gateway.key").read_text().strip()
    body = {"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        FleetClient(lab, subscribe=[]) as fleet,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        await fleet.wait_connected(20)

        async def warm_and_peered() -> bool:
            status = await fleet.call("hub", "gateway.status")
            models = (await fleet.call("node", "models.list"))["models"]
            return status["peers"].get("node") == "online" and models[0]["state"] == "warm"

        await wait_for(warm_and_peered, timeout=60, interval=0.1)
        url = f"{lab.gateway.url}/chat/completions"
        async with http.post(url, json=body) as first:
            assert first.status == 200, await first.text()
        endpoint = (await fleet.call("node", "models.get", {"model": "solo"}))["endpoint"]

        restart_agent(demo, "node")

        async def back() -> bool:
            try:
                status = await fleet.call("hub", "gateway.status")
                models = (await fleet.call("node", "models.list"))["models"]
            except Exception:
                return False
            return status["peers"].get("node") == "online" and models[0]["state"] == "warm"

        await wait_for(back, timeout=60, interval=0.1)
        # served at the address the gateway has pooled connections to from before the restart
        assert (await fleet.call("node", "models.get", {"model": "solo"}))["endpoint"] == endpoint
        async with http.post(url, json=body) as again:
            assert again.status == 200, await again.text()
            assert again.headers["x-cetlab-target"] == "node"
