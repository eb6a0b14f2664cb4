"""A rotation in the middle of a stream through the gateway: the model goes out with mode=wait, so the stream it was
answering finishes (vLLM 0.33's default sleep, abort, would cut it), and the next set comes up."""

from __future__ import annotations

import openai
import pytest

from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import P4, SIM, gateway_key, running_lab
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(180)


LAB = {
    "lab": "rotation-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4]}}],
    "models": [  # the two do not fit on node's one GPU together: the rotation swaps them
        {
            "name": "first",
            "path": "models/first",
            "engine": "sim",
            "machine": "node",
            "gpus": [0],
            "vram_gib": 6,
            "sim": {**SIM, "tokens_per_s": 8},
        },
        {
            "name": "second",
            "path": "models/second",
            "engine": "sim",
            "machine": "node",
            "gpus": [0],
            "vram_gib": 6,
            "sim": {**SIM, "tokens_per_s": 0},
        },
    ],
    "orchestra": {"warm": ["first"], "rotation": [["second"], ["first"]]},  # the first rotation brings second in
    "gateway": {"machine": "hub"},
}


@pytest.fixture(scope="module")
def rotation_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "rot") as demo:
        yield demo


async def test_a_rotation_during_a_stream_lets_the_stream_finish(rotation_lab):
    lab = load_lab(rotation_lab.lab_path)
    key = gateway_key(rotation_lab)
    async with (
        FleetClient(lab, subscribe=[]) as fleet,
        openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0) as sdk,
    ):
        await fleet.wait_connected(20)

        async def states() -> dict[str, dict]:
            return {m["name"]: m for m in (await fleet.call("node", "models.list"))["models"]}

        async def first_up() -> bool:
            status = await fleet.call("hub", "gateway.status")
            return (await states())["first"]["state"] == "warm" and status["peers"].get("node") == "online"

        await wait_for(first_up, timeout=60, interval=0.2)
        stream = await sdk.chat.completions.create(
            model="first", messages=[{"role": "user", "content": "go on"}], max_tokens=16, stream=True
        )  # 2 s at 8 tokens/s
        chunks = [await anext(aiter(stream))]
        await fleet.call("node", "models.rotate")

        async def swapping() -> bool:
            return (await states())["first"]["op"] is not None

        await wait_for(swapping, timeout=10)
        chunks += [c async for c in stream]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert finishes == ["length"] and len(content.split()) == 16

        async def rotated() -> bool:
            now = await states()
            return now["second"]["state"] == "warm" and now["first"]["state"] == "sleeping" and not now["first"]["op"]

        await wait_for(rotated, timeout=30, interval=0.2)
        answer = await sdk.chat.completions.create(model="second", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert answer.model == "second" and answer.choices[0].message.content
