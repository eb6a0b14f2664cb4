"""Each machine's agent runs its own placement of a model with replicas, and takes one added or removed by a push live.

In process (tests/support/inprocess.py): real agents and a real client over memory pipes; no engine is started here.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from agents.wire.protocol import ErrorCode, RemoteError

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


SIM = {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.05, "wake_s": 0.05, "tokens_per_s": 0, "placeholder_mib": 1}


LAB = {
    "lab": "replica-agents",
    "machines": [
        {"name": "a", "gpus": {"sim": [P4]}},
        {"name": "b", "gpus": {"sim": [P4, P4]}},
        {"name": "c", "gpus": {"sim": [P4]}},
    ],
    "models": [
        {
            "name": "chat",
            "path": "models/chat",
            "engine": "sim",
            "machine": "a",
            "gpus": [0],
            "vram_gib": 1,
            "sim": SIM,
            "replicas": [{"machine": "b", "gpus": [1]}],
        }
    ],
}


async def placements(client, machine: str) -> list[tuple[str, str, list[int]]]:
    listing = await client.call(machine, "models.list")
    return [(m["name"], m["machine"], m["gpus"]) for m in listing["models"]]


async def test_each_machine_runs_its_own_placement_and_a_push_adds_or_drops_one_live(in_process):
    lab = await in_process(LAB)
    client = lab.client()
    await client.start()
    await client.wait_connected(10)

    assert await placements(client, "a") == [("chat", "a", [0])]
    assert await placements(client, "b") == [("chat", "b", [1])]  # the replica's own GPUs
    assert await placements(client, "c") == []
    with pytest.raises(RemoteError) as caught:
        await client.call("c", "models.get", {"model": "chat"})
    assert caught.value.code == ErrorCode.NOT_FOUND and "chat runs on a and b, not c" in caught.value.message

    moved = copy.deepcopy(LAB)
    moved["models"][0]["replicas"] = [{"machine": "c", "gpus": [0]}]  # the replica goes from b to c
    text = yaml.safe_dump(moved, sort_keys=False)
    for machine in ("a", "b", "c"):
        await client.call(machine, "lab.apply", {"text": text})
    assert await placements(client, "b") == []
    assert await placements(client, "c") == [("chat", "c", [0])]
    assert await placements(client, "a") == [("chat", "a", [0])]
