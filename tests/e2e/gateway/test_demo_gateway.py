"""The demo lab's gateway, as docs/gateway.md shows it: curl with the demo key wakes a sleeping model, asks the
orchestra group, and gets real tokens from the tiny Llama on `transformers serve` (slow)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess

import pytest

from agents.orchestra.engines.transformers.engine import transformers_cli
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.engine_sockets import assert_engines_on_sockets
from tests.support.gateway import gateway_key
from tests.support.waits import wait_for

pytestmark = [pytest.mark.timeout(420), pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The bundled demo lab on its own (the shared demo_lab's model states are other tests' fixtures)."""
    with DemoLab(tmp_path_factory.mktemp("gwdemo")) as lab:
        yield lab


def curl(demo: DemoLab, path: str, body: dict | None = None) -> tuple[dict, dict]:
    """(headers, JSON body) of curl against the demo's gateway with the key it wrote."""
    lab = load_lab(demo.lab_path)
    key = gateway_key(demo)
    argv = ["curl", "-s", "-i", "--max-time", "300", f"{lab.gateway.url}{path}", "-H", f"Authorization: Bearer {key}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=320).stdout
    head, _, text = out.replace("\r\n", "\n").partition("\n\n")
    headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in head.splitlines()[1:] if ":" in line}
    return {"status": int(head.split()[1]), **headers}, json.loads(text)


async def states(client: FleetClient, machine: str) -> dict[str, str]:
    return {m["name"]: m["state"] for m in (await client.call(machine, "models.list"))["models"]}


async def test_demo_gateway_wakes_asks_the_group_and_serves_real_tokens(demo):
    key_file = demo.dir / "console" / "gateway.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    lab = load_lab(demo.lab_path)
    assert lab.gateway.machine == "pharaoh" and lab.providers[0].simulated
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(30)

        async def planned() -> bool:  # the start plan: phi-3-mini comes up, then sleeps; the gateway's peers connect
            status = await client.call("pharaoh", "gateway.status")
            return (await states(client, "workstation")).get("phi-3-mini") == "sleeping" and all(
                v == "online" for v in status["peers"].values()
            )

        await wait_for(planned, timeout=180, interval=0.2)
        headers, body = curl(
            demo,
            "/chat/completions",
            {"model": "phi-3-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "wake up"}]},
        )
        assert headers["status"] == 200 and headers["x-cetlab-woke"] == "true", body
        assert body["usage"]["completion_tokens"] == 8 and (await states(client, "workstation"))["phi-3-mini"] == "warm"

        headers, body = curl(
            demo,
            "/orchestra/chat/completions",
            {"group": "ensemble", "deadline_s": 60, "max_tokens": 8, "messages": [{"role": "user", "content": "all of you"}]},
        )
        assert headers["status"] == 200 and body["answered"] == body["asked"] == 5 and not body["partial"], body
        by_model = {r["model"]: r for r in body["results"]}
        assert by_model["mistral-large"]["tier"] == "provider" and by_model["mistral-large"]["cost"] > 0
        assert by_model["llama-3.1-8b"]["tier"] == "local" and by_model["llama-3.1-8b"]["cloud_equivalent"] is not None
        assert body["cost"] == pytest.approx(sum(r["cost"] for r in body["results"]))

        status = await client.call("pharaoh", "gateway.status")
        figures = {m["name"]: m for m in status["models"]}
        assert (
            figures["phi-3-mini"]["wakes"] == 1
            and figures["phi-3-mini"]["requests"] == 1
            and figures["llama-3.1-8b"]["requests"] == 1
        )
        sim_cloud = next(p for p in status["providers"] if p["name"] == "sim-cloud")
        assert sim_cloud["spend_today"] > 0
        assert sim_cloud["key_set"]  # a simulated stand-in needs no key: never "API key not set" on the demo
        assert_engines_on_sockets(demo)  # every engine of the demo, on every machine, on 127.0.0.1 only


@pytest.mark.slow
@pytest.mark.skipif(
    transformers_cli() is None, reason="the transformers CLI is not installed (pip install 'transformers[serving]')"
)
async def test_demo_gateway_loads_the_tiny_llama_and_returns_real_tokens(demo):
    """The real engine: cold, loaded on request behind the queue (the tiny model is made first), real tokens back."""
    headers, body = curl(demo, "/completions", {"model": "tiny-llama", "prompt": "Capital of France:", "max_tokens": 4})
    assert headers["status"] == 200 and headers["x-cetlab-tier"] == "local" and "x-cetlab-simulated" not in headers, body
    assert headers["x-cetlab-woke"] == "true" and body["usage"]["completion_tokens"] >= 1
