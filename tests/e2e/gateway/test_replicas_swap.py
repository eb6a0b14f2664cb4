"""A model on two replicas survives a swap (or a stop) of one without a failed request (issue 31, item 4).

Three agents on loopback (real processes, real SSH, simulated GPUs and engines): the gateway on `hub`, the model
`chat` on `a` and on `b`. A stream of requests runs through the gateway from several conversations at once; `a` swaps
`chat` out for `other` on its one GPU. Its agent drains `chat` first (the gateway stops sending it requests, the ones
it runs end), then puts it to sleep. Every request is answered, and none reaches `a` after the gateway showed it
draining.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import aiohttp
import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


SIM = {"load_s": 0.05, "cold_factor": 1, "warmup_s": 0.05, "wake_s": 0.05, "tokens_per_s": 40, "placeholder_mib": 1}


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


LAB = {
    "lab": "replicas-e2e",
    "machines": [
        {"name": "hub", "gpus": {"sim": [P4]}},
        {"name": "a", "gpus": {"sim": [P4]}},
        {"name": "b", "gpus": {"sim": [P4]}},
    ],
    "models": [
        {
            "name": "chat",
            "path": "models/chat",
            "engine": "sim",
            "machine": "a",
            "gpus": [0],
            "vram_gib": 6,
            "sim": SIM,
            "replicas": [{"machine": "b", "gpus": [0]}],
        },
        {"name": "other", "path": "models/other", "engine": "sim", "machine": "a", "gpus": [0], "vram_gib": 6, "sim": SIM},
    ],
    "orchestra": {"warm": ["chat"]},
    "gateway": {"machine": "hub"},
}


WORKERS = 4


@pytest.fixture
def demo(tmp_path):
    source = tmp_path / "src" / "lab.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(LAB, sort_keys=False))
    with DemoLab(tmp_path / "demo", source=source) as lab:
        yield lab


@pytest.mark.parametrize("verb", ["swap", "cold"])
async def test_a_model_on_two_replicas_survives_a_swap_of_one_without_a_failed_request(demo, verb):
    command = ("swap", "chat", "other", "--machine", "a") if verb == "swap" else ("cold", "chat", "--machine", "a")
    out_states = ("sleeping",) if verb == "swap" else ("cold", "cached")  # a sim engine sleeps; cold stops it
    lab = load_lab(demo.lab_path)
    key = (demo.dir / "console" / "gateway.key").read_text().strip()
    url = f"{lab.gateway.url}/chat/completions"
    answers: list[tuple[float, int, str, str]] = []  # (sent at, status, the machine that answered, the body on error)
    stop = asyncio.Event()

    async def converse(http: aiohttp.ClientSession, who: int) -> None:
        messages = [{"role": "system", "content": f"You are assistant {who}."}]
        while not stop.is_set():
            messages.append({"role": "user", "content": f"turn {len(messages)}"})
            sent = time.monotonic()
            async with http.post(url, json={"model": "chat", "messages": messages[-3:], "max_tokens": 3}) as answer:
                text = await answer.text()
                answers.append((sent, answer.status, answer.headers.get("x-cetlab-target", "?"), text[:300]))

    async with (
        FleetClient(lab, subscribe=[]) as fleet,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        await fleet.wait_connected(20)

        async def placement(machine: str, name: str = "chat") -> dict:
            return next(m for m in (await fleet.call(machine, "models.list"))["models"] if m["name"] == name)

        async def replicas() -> dict[str, dict]:
            status = await fleet.call("hub", "gateway.status")
            chat = next(m for m in status["models"] if m["name"] == "chat")
            return {r["machine"]: r for r in chat["replicas"]}

        async def both_serve() -> bool:
            seen = await replicas()
            return all(seen.get(m, {}).get("state") == "warm" for m in ("a", "b"))

        await wait_for(both_serve, timeout=60, interval=0.1)
        workers = [asyncio.create_task(converse(http, i)) for i in range(WORKERS)]
        try:
            await wait_for(lambda: {"a", "b"} <= {t for _, s, t, _ in answers if s == 200}, timeout=30)
            swap = asyncio.create_task(asyncio.to_thread(cli, demo, *command))

            async def gateway_sees_a_draining() -> float | None:
                return time.monotonic() if (await replicas())["a"]["draining"] else None

            seen_draining = await wait_for(gateway_sees_a_draining, timeout=30, interval=0.02)

            async def swapped() -> bool:
                chat, other = await placement("a"), await placement("a", "other")
                return chat["state"] in out_states and not chat["op"] and (verb == "cold" or other["state"] == "warm")

            await wait_for(swapped, timeout=60, interval=0.1)
            code, said = await swap
            said = said["out"] if verb == "swap" else said
            assert code == 0 and said["machine"] == "a" and said["state"] in out_states, said
            after = len(answers)
            await wait_for(lambda: len(answers) >= after + 2 * WORKERS, timeout=30)
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)

        failed = [(status, where, body) for _, status, where, body in answers if status != 200]
        assert not failed, failed
        late_at_a = [sent - seen_draining for sent, _, where, _ in answers if where == "a" and sent > seen_draining]
        assert not late_at_a  # none reached the draining replica once the gateway showed it draining
        assert any(where == "b" and sent > seen_draining for sent, _, where, _ in answers)
        history = (await fleet.call("a", "models.get", {"model": "chat"}))["history"]
        drains = [e for e in history if e["event"] == "drain"]
        assert drains and drains[0]["detail"] == {"running": 0}  # it ended its requests before it went out

        async def gateway_sees_a_out() -> bool:  # the gateway's view is the agent's last tick: up to a second behind
            return (await replicas())["a"]["state"] in out_states

        await wait_for(gateway_sees_a_out, timeout=10, interval=0.05)

    # `cetlab models` shows the model once with its two placements; a verb on it names the replica
    code, listing = await asyncio.to_thread(cli, demo, "models")
    assert code == 0
    placed = [(r["machine"], r["state"] in out_states or r["state"], r["draining"]) for r in listing["replicas"]["chat"]]
    assert placed == [("a", True, False), ("b", "warm", False)]
    code, text = await asyncio.to_thread(cli, demo, "models", json_out=False)
    table = text.split("\nTOK/S")[0].split("\nVRAM needed")[0]  # the table, not the notes under it
    rows = [line.split()[:3] for line in table.splitlines() if "chat" in line]
    assert rows == [["chat", "(2", "replicas)"], ["chat", "b", "0"]], text
    code, refused = await asyncio.to_thread(cli, demo, "sleep", "chat")
    assert code == 1 and "--machine" in refused["error"]["message"] and "a, b" in refused["error"]["message"]


def cli(demo: DemoLab, *args: str, json_out: bool = True) -> tuple[int, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path), *(["--json"] if json_out else []), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if not json_out:
        return done.returncode, done.stdout
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}
