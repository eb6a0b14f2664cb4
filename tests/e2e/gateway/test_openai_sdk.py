"""The gateway driven by the real openai SDK, as lab tools drive it: model listing and lookup, chat and completions
plain and streamed with and without usage, n and stop, errors as the SDK's own classes, a fallback, a wake, a served
checkpoint by name, and a model put to sleep in the middle of a stream. The models on `node` are reached over the
SSH tunnel; everything runs on loopback with real agents."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import aiohttp
import openai
import pytest

from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.engine_sockets import assert_engines_on_sockets
from tests.support.gateway import P4, gateway_key, running_lab, sim_model
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


LAB = {
    "lab": "sdk-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4, P4, P4]}}],
    "models": [
        sim_model("chatty", "node", 0),
        sim_model("slowly", "node", 1, tokens_per_s=8),
        sim_model("dozy", "node", 2),
        sim_model("far-away", "hub", 0, load_s=60),
    ],
    "orchestra": {"warm": ["chatty", "slowly"], "sleeping": ["dozy"]},
    "gateway": {
        "machine": "hub",
        "models": {"far-away": {"fallback": "cloud-big", "max_wait_s": 1}, "chatty": {"aliases": ["chat"]}},
    },
    "checkpoints": {"dirs": [{"machine": "node", "path": "runs"}], "settle_s": 0, "poll_s": 0.5},
    "providers": [
        {
            "name": "cloud",
            "base_url": "http://127.0.0.1:1/v1",
            "simulated": True,
            "models": [{"name": "cloud-big", "prompt_per_million": 0.88, "completion_per_million": 0.88}],
        }
    ],
}


MESSAGES = [{"role": "user", "content": "say something"}]


@pytest.fixture(scope="module")
def sdk_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "sdk") as demo:
        yield demo


async def states(fleet: FleetClient, machine: str) -> dict[str, dict]:
    return {m["name"]: m for m in (await fleet.call(machine, "models.list"))["models"]}


@pytest.fixture
async def fleet(sdk_lab):
    async with FleetClient(load_lab(sdk_lab.lab_path), subscribe=[]) as client:
        await client.wait_connected(20)

        async def ready() -> bool:
            node = await states(client, "node")
            status = await client.call("hub", "gateway.status")
            return (
                node["chatty"]["state"] == node["slowly"]["state"] == "warm"
                and node["dozy"]["state"] in ("sleeping", "warm")
                and all(v == "online" for v in status["peers"].values())
            )

        await wait_for(ready, timeout=60, interval=0.2)
        yield client


@pytest.fixture
async def sdk(sdk_lab, fleet):
    lab = load_lab(sdk_lab.lab_path)
    key = gateway_key(sdk_lab)
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0, timeout=60) as client:
        yield client


def request_log(demo: DemoLab, model: str) -> list[tuple]:
    db = sqlite3.connect(demo.dir / "agents" / "hub" / "state.db")
    try:
        return db.execute(
            "SELECT stream, status, usage_source, completion_tokens FROM gateway_requests WHERE model = ? ORDER BY id", (model,)
        ).fetchall()
    finally:
        db.close()


async def test_models_list_and_retrieve(sdk):
    listed = {m.id: m for m in (await sdk.models.list()).data}
    assert {"chatty", "slowly", "dozy", "far-away", "cloud-big"} <= set(listed)
    assert all(isinstance(m.created, int) and m.created > 0 for m in listed.values())
    assert (await sdk.models.retrieve("chatty")).id == "chatty"
    assert (await sdk.models.retrieve("chat")).id == "chat"  # an alias answers as itself
    with pytest.raises(openai.NotFoundError) as err:
        await sdk.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found"
    for hostile in ("[bold]x<script>", "a" * 5000):  # not a name's form: a 404 that does not echo it
        with pytest.raises(openai.NotFoundError) as err:
            await sdk.models.retrieve(hostile)
        assert err.value.body["code"] == "model_not_found" and hostile not in err.value.body["message"]


async def test_chat_and_completions_plain_and_streamed(sdk, sdk_lab):
    answer = await sdk.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5)
    assert answer.model == "chat" and answer.choices[0].message.content and answer.usage.completion_tokens == 5
    text = await sdk.completions.create(model="chatty", prompt="once upon", max_tokens=4)
    assert text.model == "chatty" and text.choices[0].text and text.usage.completion_tokens == 4

    chunks = [c async for c in await sdk.chat.completions.create(model="chatty", messages=MESSAGES, max_tokens=6, stream=True)]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.model == "chatty" for c in chunks) and all(c.usage is None for c in chunks)  # usage not asked: none passed on
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    # ... yet the gateway asked the engine for it: the stream is metered from the engine's count, not estimated
    await wait_for(lambda: (1, 200, "engine", 6) in request_log(sdk_lab, "chatty"), timeout=10)

    chunks = [
        c
        async for c in await sdk.chat.completions.create(
            model="chatty", messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert chunks[-1].usage.completion_tokens == 3 and not chunks[-1].choices
    pieces = [c async for c in await sdk.completions.create(model="chatty", prompt="abc", max_tokens=3, stream=True)]
    assert all(p.model == "chatty" for p in pieces) and "".join(p.choices[0].text for p in pieces if p.choices).strip()


async def test_n_and_stop(sdk):
    two = await sdk.chat.completions.create(model="chatty", messages=MESSAGES, max_tokens=4, n=2, seed=1)
    assert sorted(c.index for c in two.choices) == [0, 1] and two.usage.completion_tokens == 8
    word = two.choices[0].message.content.split()[1]
    stopped = await sdk.chat.completions.create(model="chatty", messages=MESSAGES, max_tokens=4, seed=1, stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and word not in stopped.choices[0].message.content


async def test_errors_are_the_sdks_own_classes(sdk, sdk_lab):
    lab = load_lab(sdk_lab.lab_path)
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key="not-a-key", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as err:
            await stranger.chat.completions.create(model="chatty", messages=MESSAGES)
    assert err.value.body["type"] == "authentication_error"
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="nobody", messages=MESSAGES)
    for bad in ({"temperature": 5}, {"max_tokens": -1}, {"n": 0}, {"top_p": 2}):
        with pytest.raises(openai.BadRequestError) as err:
            await sdk.chat.completions.create(model="chatty", messages=MESSAGES, **bad)
        assert err.value.body["param"] == next(iter(bad)), bad
    with pytest.raises(openai.BadRequestError) as err:  # inside OpenAI's range, refused by the engine (vLLM's rule)
        await sdk.chat.completions.create(model="chatty", messages=MESSAGES, top_p=0)
    assert "top_p must be in (0, 1]" in err.value.body["message"]
    key = gateway_key(sdk_lab)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        for method, path, status in (
            ("GET", "/v1/nowhere", 404),
            ("DELETE", "/v1/models", 405),
            ("POST", "/v1/chat/completions", 413),
        ):
            data = b"x" * (lab.gateway.policies.max_body_bytes + 1) if status == 413 else None
            async with session.request(method, lab.gateway.url.removesuffix("/v1") + path.removeprefix(""), data=data) as r:
                assert r.status == status and r.content_type == "application/json"
                assert json.loads(await r.read())["error"]["type"] == "invalid_request_error"


async def test_fallback_and_wake(sdk, fleet):
    raw = await sdk.chat.completions.with_raw_response.create(model="far-away", messages=MESSAGES, max_tokens=3)
    answer = raw.parse()
    assert raw.headers["x-cetlab-tier"] == "provider" and answer.model == "far-away"  # never the upstream name
    if (await states(fleet, "node"))["dozy"]["state"] == "warm":
        await fleet.call("node", "models.sleep", {"model": "dozy"})
        await wait_for(lambda: _state_is(fleet, "dozy", "sleeping"), timeout=30)
    raw = await sdk.chat.completions.with_raw_response.create(model="dozy", messages=MESSAGES, max_tokens=3)
    assert raw.headers["x-cetlab-woke"] == "true" and raw.parse().choices[0].message.content


async def _state_is(fleet: FleetClient, name: str, state: str) -> bool:
    entry = (await states(fleet, "node"))[name]
    return entry["state"] == state and not entry["op"]


async def test_a_served_checkpoint_by_name(sdk, sdk_lab, fleet):
    """A full checkpoint served as a model of its own (`serve-checkpoint`, here on the sim engine of `chatty`)."""
    folder = sdk_lab.dir / "runs" / "cet-b" / "checkpoint-200"
    folder.mkdir(parents=True)
    for name, text in (
        ("config.json", "{}"),
        ("model.safetensors", "weights"),
        ("trainer_state.json", '{"global_step": 200, "log_history": []}'),
    ):
        (folder / name).write_text(text)

    async def found() -> bool:
        listing = await fleet.call("node", "checkpoints.list", {"run": "cet-b"})
        return any(c["step"] == 200 and c["complete"] for c in listing["checkpoints"])

    await wait_for(found, timeout=30, interval=0.2)
    served = await fleet.call("node", "checkpoints.serve", {"run": "cet-b", "step": 200, "model": "chatty"})
    assert served["model"] == "cet-b-step200" and served["mode"] == "full"

    async def warm() -> bool:
        return any(m.id == "cet-b-step200" and getattr(m, "state", None) == "warm" for m in (await sdk.models.list()).data)

    await wait_for(warm, timeout=60, interval=0.2)
    answer = await sdk.chat.completions.create(model="cet-b-step200", messages=MESSAGES, max_tokens=3)
    assert answer.model == "cet-b-step200" and answer.choices[0].message.content
    await wait_for(lambda: (0, 200, "engine", 3) in request_log(sdk_lab, "cet-b-step200"), timeout=10)  # metered as itself


async def test_a_loaded_adapter_by_name(sdk, sdk_lab, fleet):
    adapter = sdk_lab.dir / "adapters" / "cet-a-100"
    adapter.mkdir(parents=True, exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "base_model_name_or_path": "models/chatty"}))
    await fleet.call("node", "models.adapter", {"model": "chatty", "name": "cet-a-step100", "path": str(adapter)})

    async def listed() -> bool:
        return "cet-a-step100" in {m.id for m in (await sdk.models.list()).data}

    await wait_for(listed, timeout=10)
    answer = await sdk.chat.completions.create(model="cet-a-step100", messages=MESSAGES, max_tokens=2)
    assert answer.model == "cet-a-step100" and answer.choices[0].message.content
    await wait_for(lambda: (0, 200, "engine", 2) in request_log(sdk_lab, "cet-a-step100"), timeout=10)  # metered as itself
    # a second load of the same name reloads it in place (vLLM refuses it without load_inplace)
    await fleet.call("node", "models.adapter", {"model": "chatty", "name": "cet-a-step100", "path": str(adapter)})


async def test_a_model_put_to_sleep_mid_stream_finishes_the_stream_and_later_requests_wake_it(sdk, fleet, sdk_lab):
    stream = await sdk.chat.completions.create(model="slowly", messages=MESSAGES, max_tokens=16, stream=True)  # 2 s
    chunks = [await anext(aiter(stream))]
    sleeping = asyncio.create_task(fleet.call("node", "models.sleep", {"model": "slowly"}, timeout=60))
    await wait_for(lambda: _op_is(fleet, "slowly", "sleep"), timeout=10)
    # sent while the engine drains: it queues there, and the gateway wakes the model for it once it sleeps
    later = asyncio.create_task(sdk.chat.completions.with_raw_response.create(model="slowly", messages=MESSAGES, max_tokens=2))
    chunks += [c async for c in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length" and len(content.split()) == 16
    await sleeping
    raw = await within(later, 60)
    assert raw.parse().choices[0].message.content
    assert (await fleet.call("hub", "gateway.status"))["models"] and next(
        m for m in (await fleet.call("hub", "gateway.status"))["models"] if m["name"] == "slowly"
    )["wakes"] >= 1
    assert_engines_on_sockets(sdk_lab)


async def _op_is(fleet: FleetClient, name: str, op: str) -> bool:
    return (await states(fleet, "node"))[name]["op"] == op


async def test_ids_are_openais_for_each_route_and_a_chat_without_good_messages_is_refused(sdk, sdk_lab):
    answer = await sdk.chat.completions.create(model="chatty", messages=MESSAGES, max_tokens=2)
    text = await sdk.completions.create(model="chatty", prompt="once", max_tokens=2)
    assert answer.id.startswith("chatcmpl-") and text.id.startswith("cmpl-") and not text.id.startswith("chatcmpl-")
    pieces = [p async for p in await sdk.completions.create(model="chatty", prompt="abc", max_tokens=2, stream=True)]
    assert pieces and all(p.id.startswith("cmpl-") for p in pieces)
    lab = load_lab(sdk_lab.lab_path)
    key = gateway_key(sdk_lab)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        for messages, param in (
            (None, "messages"),
            ("hello", "messages"),
            ([], "messages"),
            (["hello"], "messages[0]"),
            ([{"content": "hi"}], "messages[0].role"),
            ([{"role": "user", "content": "hi"}, {"role": 3}], "messages[1].role"),
        ):
            body = {"model": "chatty", "max_tokens": 2, **({} if messages is None else {"messages": messages})}
            async with session.post(lab.gateway.url + "/chat/completions", json=body) as r:
                error = json.loads(await r.read())["error"]
            assert r.status == 400 and error["param"] == param and error["type"] == "invalid_request_error", (messages, error)
            assert f"'{param}" in error["message"]


def test_a_llama_server_completions_id_gets_openais_prefix_through_the_gateway():
    from agents.gateway.openai_api import StreamRewriter, rewrite_answer

    answer = b'{"id":"chatcmpl-abc","object":"text_completion","model":"m.gguf","choices":[]}'  # llama-server's own form
    assert json.loads(rewrite_answer(answer, "small", chat=False))["id"] == "cmpl-abc"
    assert json.loads(rewrite_answer(answer, "small", chat=True))["id"] == "chatcmpl-abc"
    assert json.loads(rewrite_answer(b'{"id":"msg_1","model":"x"}', "small", chat=True))["id"] == "msg_1"  # a provider's
    out = StreamRewriter("small", wants_usage=False, chat=False).feed(b'data: {"id":"chatcmpl-9","model":"m","choices":[]}\n\n')
    assert json.loads(out.removeprefix(b"data: "))["id"] == "cmpl-9"
