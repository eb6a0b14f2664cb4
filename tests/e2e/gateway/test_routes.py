"""The gateway's other routes driven by the real clients, against both simulators: /v1/responses (plain and streamed,
the openai SDK accumulating the events), /v1/embeddings (the SDK's default base64 and floats), /v1/rerank (Jina's and
Cohere's body), Anthropic's /v1/messages (the anthropic SDK, plain and streamed, its key as x-api-key, its error
classes); a route asked of a model that does not serve it is refused naming `model`; each request is held and metered
as chat is; a key limited to one model is refused the others on every route."""

from __future__ import annotations

import json
import sqlite3

import aiohttp
import anthropic
import openai
import pytest

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import P4, gateway_key, running_lab
from tests.support.gateway_routes import model
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


MODELS = [
    model("talk", "sim", 0),
    model("vectors", "sim", 1, "embedding"),
    model("llama-talk", "sim-llamacpp", 2),
    model("llama-vectors", "sim-llamacpp", 3, "embedding"),
    model("llama-ranks", "sim-llamacpp", 4, "rerank"),
    model("ranks", "sim", 5, "rerank"),
]


NOT_WARMED = [{"name": "hf-vectors", "path": "models/hf", "engine": "transformers", "machine": "hub", "serves": "embedding"}]


LAB = {
    "lab": "routes-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4] * 6}}],
    "models": MODELS + NOT_WARMED,
    "orchestra": {"warm": [m["name"] for m in MODELS]},
    "gateway": {"machine": "hub"},
}


CHAT_MODELS = ("talk", "llama-talk")


@pytest.fixture(scope="module")
def routes_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "routes") as demo:
        yield demo


@pytest.fixture
async def ready(routes_lab):
    async with FleetClient(load_lab(routes_lab.lab_path), subscribe=[]) as client:
        await client.wait_connected(20)

        async def warm() -> bool:
            listed = (await client.call("hub", "models.list"))["models"]
            return all(m["state"] == "warm" for m in listed if m["name"] in {w["name"] for w in MODELS})

        await wait_for(warm, timeout=90, interval=0.2)
        yield client


@pytest.fixture
async def sdk(routes_lab, ready):
    lab = load_lab(routes_lab.lab_path)
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=gateway_key(routes_lab), max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
async def claude(routes_lab, ready):
    base = load_lab(routes_lab.lab_path).gateway.url.removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=base, api_key=gateway_key(routes_lab), max_retries=0, timeout=60) as c:
        yield c


def request_log(demo: DemoLab, model: str) -> list[tuple]:
    db = sqlite3.connect(demo.dir / "agents" / "hub" / "state.db")
    try:
        return db.execute(
            "SELECT stream, status, usage_source, prompt_tokens, completion_tokens FROM gateway_requests WHERE model = ?"
            " ORDER BY id",
            (model,),
        ).fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("name", CHAT_MODELS)
async def test_responses_plain_and_streamed(sdk, routes_lab, name):
    answer = await sdk.responses.create(model=name, input="say something", instructions="be brief", max_output_tokens=5)
    assert answer.model == name and answer.status == "incomplete" and answer.output_text.strip()
    assert answer.usage.output_tokens == 5 and answer.usage.input_tokens > 0
    assert answer.incomplete_details.reason == "max_output_tokens"
    listed = [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}]
    events = [e async for e in await sdk.responses.create(model=name, input=listed, max_output_tokens=4, stream=True)]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    # the length ran out: OpenAI ends such a stream with response.incomplete, its output and usage in it
    final = events[-1].response
    assert kinds.count("response.output_text.delta") == 4 and final.output_text.strip() and final.usage.output_tokens == 4
    assert final.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # held and metered as chat is: the engine's count, under the model's name, stream and not
    await wait_for(
        lambda: {(0, 200, "engine", 5), (1, 200, "engine", 4)} <= {r[:3] + r[4:] for r in request_log(routes_lab, name)},
        timeout=10,
    )


async def test_responses_refuses_what_it_cannot_map(sdk):
    for bad, param in (
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input[0].content[0].type",
        ),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await sdk.responses.create(**{"model": "talk", "input": "hi", **bad})
        assert err.value.body["param"] == param, bad


@pytest.mark.parametrize("name", ["vectors", "llama-vectors"])
async def test_embeddings(sdk, routes_lab, name):
    answer = await sdk.embeddings.create(model=name, input=["the cat sat", "the cat sat", "stock prices fell"])
    assert answer.model == name and [d.index for d in answer.data] == [0, 1, 2]
    first, same, other = (d.embedding for d in answer.data)
    assert first == same and first != other and len(first) > 1  # base64 (the SDK's default) decoded to the same floats
    floats = await sdk.embeddings.create(model=name, input="the cat sat", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(first, abs=1e-6)
    assert answer.usage.prompt_tokens > 0
    await wait_for(lambda: any(r[1] == 200 and r[2] == "engine" and r[4] == 0 for r in request_log(routes_lab, name)), timeout=10)
    with pytest.raises(openai.BadRequestError) as err:
        await sdk.embeddings.create(model=name, input=[])
    assert err.value.body["param"] == "input"


@pytest.mark.parametrize("name", ["ranks", "llama-ranks"])
async def test_rerank(routes_lab, ready, name):
    url = load_lab(routes_lab.lab_path).gateway.url + "/rerank"
    docs = ["stock prices fell sharply", "the cat sat on the mat", "a cat and a mat"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {gateway_key(routes_lab)}"}) as session:
        async with session.post(url, json={"model": name, "query": "cat on the mat", "documents": docs, "top_n": 2}) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
        results = answer["results"]
        assert len(results) == 2 and results[0]["index"] == 1 and 0 not in [x["index"] for x in results]
        assert results[0]["relevance_score"] >= results[1]["relevance_score"] and answer["model"] == name
        async with session.post(url, json={"model": name, "query": "q", "documents": ["d"] * 1001}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "documents"


async def test_a_route_the_model_does_not_serve_is_refused_naming_model(sdk):
    listed = {m.id: m for m in (await sdk.models.list()).data}
    assert (
        listed["vectors"].serves == "embedding" and listed["llama-ranks"].serves == "rerank" and listed["talk"].serves == "chat"
    )
    with pytest.raises(openai.BadRequestError) as err:
        await sdk.chat.completions.create(model="vectors", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["param"] == "model" and "embedding" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await sdk.embeddings.create(model="talk", input="hi")
    assert err.value.body["param"] == "model" and "/v1/chat/completions" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await sdk.responses.create(model="llama-ranks", input="hi")
    assert err.value.body["param"] == "model"


@pytest.mark.parametrize("name", CHAT_MODELS)
async def test_anthropic_messages_plain_and_streamed(claude, routes_lab, name):
    message = await claude.messages.create(
        model=name, max_tokens=5, system="be brief", messages=[{"role": "user", "content": "say something"}]
    )
    assert message.model == name and message.role == "assistant" and message.content[0].text.strip()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5 and message.usage.input_tokens > 0
    async with claude.messages.stream(
        model=name, max_tokens=4, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert (
        kinds[0] == "message_start"
        and kinds[1] == "content_block_start"
        and kinds[-3:]
        == [
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    )
    assert final.content[0].text.strip() and final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"


async def test_anthropic_errors_are_its_sdks_classes(claude, routes_lab):
    base = load_lab(routes_lab.lab_path).gateway.url.removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=base, api_key="not-a-key", max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError) as err:
            await stranger.messages.create(model="talk", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.create(model="nobody", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as err:
        await claude.messages.create(model="vectors", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert "model" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        await claude.messages.create(
            model="talk", max_tokens=5, messages=[{"role": "user", "content": "hi"}], tools=[{"name": "t", "input_schema": {}}]
        )
    assert err.value.body["error"]["message"].startswith("tools")


async def test_a_key_limited_to_one_model_is_refused_the_others_on_every_route(routes_lab, ready):
    lab = load_lab(routes_lab.lab_path)
    added = await ready.call("hub", "gateway.keys.add", {"name": "only-talk", "models": ["talk"]})
    key = added["key"]
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0) as limited:
        assert (await limited.responses.create(model="talk", input="hi", max_output_tokens=2)).output_text
        for call in (
            limited.embeddings.create(model="vectors", input="hi"),
            limited.responses.create(model="llama-talk", input="hi"),
        ):
            with pytest.raises(openai.NotFoundError) as err:
                await call
            assert err.value.body["param"] == "model"
    async with anthropic.AsyncAnthropic(base_url=lab.gateway.url.removesuffix("/v1"), api_key=key, max_retries=0) as c:
        with pytest.raises(anthropic.NotFoundError):
            await c.messages.create(model="llama-talk", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    body = json.dumps({"model": "vectors", "input": ["x"] * 3000}).encode()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {gateway_key(routes_lab)}"}) as session:
        async with session.post(lab.gateway.url + "/embeddings", data=body) as r:  # over OpenAI's 2048 inputs: refused
            assert r.status == 400 and (await r.json())["error"]["param"] == "input"


# a body for each route (a new route without one here fails the test below: every route must show the shared steps)
ROUTE_BODIES = {
    "/v1/chat/completions": {"model": "talk", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"model": "talk", "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": "vectors", "input": "hi"},
    "/v1/rerank": {"model": "ranks", "query": "hi", "documents": ["a", "b"]},
    "/v1/responses": {"model": "talk", "input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"model": "talk", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
}


async def test_every_route_takes_the_key_check_the_hold_and_the_meter(routes_lab, ready):
    from agents.gateway.routes import ROUTES

    base = load_lab(routes_lab.lab_path).gateway.url.removesuffix("/v1")
    keys = {}
    for name, params in (("other-model", {"models": ["nothing-*"]}), ("one-token", {"tokens_per_day": 1})):
        keys[name] = (await ready.call("hub", "gateway.keys.add", {"name": name, **params}))["key"]
    async with aiohttp.ClientSession() as session:
        for route in ROUTES:
            body = ROUTE_BODIES[route.path]
            seen = {}
            for label, headers in (
                ("no key", {}),
                ("another model's key", {"Authorization": f"Bearer {keys['other-model']}"}),
                ("a key of one token a day", {"x-api-key": keys["one-token"]}),
                ("the gateway's key", {"Authorization": f"Bearer {gateway_key(routes_lab)}"}),
            ):
                async with session.post(base + route.path, json=body, headers=headers) as r:
                    seen[label] = r.status
                    await r.read()
            assert seen == {
                "no key": 401,
                "another model's key": 404,
                "a key of one token a day": 429,  # held before going upstream: its prompt alone does not fit
                "the gateway's key": 200,
            }, route.path
            await wait_for(lambda: any(r[1] == 200 for r in request_log(routes_lab, body["model"])), timeout=10)


async def test_an_engine_never_started_for_what_a_model_serves_refuses_it_naming_serves(ready):
    from agents.wire.protocol import RemoteError

    with pytest.raises(RemoteError) as err:
        await ready.call("hub", "models.warm", {"model": "hf-vectors"})
    assert "engine transformers serves chat, not embedding" in err.value.message
