"""Replicas on the real pinned llama-server: a stream of requests through the gateway, one replica stopped with
`cetlab cold --machine`, no request fails; the drain read the engine's own count (llama-server's /metrics
`requests_processing` and `requests_deferred`), not nothing.

Two agents on loopback (real processes, real SSH), each running llama-server on a tiny GGUF written here, on the CPU.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import pytest
import yaml

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.llamacpp import llama_server_or_skip
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


WORKERS = 3


@pytest.fixture
def llama_replicas(tmp_path):
    llama_server_or_skip()
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    path = write_tiny_gguf(tmp_path / "tiny.gguf", vocab)
    lab = {
        "lab": "llama-replicas",
        "machines": [{"name": "box", "gpus": "none"}, {"name": "node", "gpus": "none"}],
        "models": [
            {
                "name": "tiny",
                "path": str(path),
                "engine": "llamacpp",
                "machine": "box",
                "load_timeout_s": "60s",
                "args": ["-c", "512", "-t", "1", "--parallel", "2"],
                "replicas": [{"machine": "node"}],
            }
        ],
        "orchestra": {"warm": ["tiny"]},
        "gateway": {"machine": "box"},
    }
    source = tmp_path / "src" / "lab.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path / "demo", source=source) as demo:
        yield demo


async def test_a_llama_server_replica_stopped_under_traffic_drains_on_its_engines_count(llama_replicas):
    demo = llama_replicas
    lab = load_lab(demo.lab_path)
    key = (demo.dir / "console" / "gateway.key").read_text().strip()
    url = f"{lab.gateway.url}/chat/completions"
    answers: list[tuple[int, str, str]] = []
    stop = asyncio.Event()

    async def converse(http: aiohttp.ClientSession, who: int) -> None:
        sent = 0
        while not stop.is_set():
            sent += 1  # a new conversation each time: no prefix keeps it on one replica
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"hello {who}.{sent}"}], "max_tokens": 24}
            async with http.post(url, json=body) as answer:
                answers.append((answer.status, answer.headers.get("x-cetlab-target", "?"), (await answer.text())[:300]))

    async with (
        FleetClient(lab, subscribe=[]) as fleet,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        await fleet.wait_connected(20)

        async def placement(machine: str) -> dict:
            return (await fleet.call(machine, "models.list"))["models"][0]

        async def both_warm() -> bool:  # as the gateway sees them
            found = [await placement(m) for m in ("box", "node")]
            assert not [p["error"] for p in found if p["state"] == "failed"]
            status = await fleet.call("box", "gateway.status")
            replicas = next(m for m in status["models"] if m["name"] == "tiny")["replicas"]
            return [r["state"] for r in replicas] == ["warm", "warm"]

        await wait_for(both_warm, timeout=120, interval=0.2)
        workers = [asyncio.create_task(converse(http, i)) for i in range(WORKERS)]
        try:
            await wait_for(lambda: {"box", "node"} <= {t for s, t, _ in answers if s == 200}, timeout=60)
            done = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "console.cli.main",
                    "--lab",
                    str(demo.lab_path),
                    "--json",
                    "cold",
                    "tiny",
                    "--machine",
                    "node",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            after = len(answers)
            await wait_for(lambda: len(answers) >= after + 2 * WORKERS, timeout=60)
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)

        assert not [a for a in answers if a[0] != 200], [a for a in answers if a[0] != 200][:5]
        assert "box" in {t for _, t, _ in answers[after:]}  # the other replica answers on
        history = (await fleet.call("node", "models.get", {"model": "tiny"}))["history"]
        drains = [e for e in history if e["event"] == "drain"]
        assert drains and drains[0]["detail"] == {"running": 0}  # llama-server's own count, read from its /metrics
