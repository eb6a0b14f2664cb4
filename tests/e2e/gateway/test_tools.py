"""Tool calling, response_format and logprobs through the gateway with the real openai SDK: passed through to an
engine that takes them (sim-llamacpp, which holds llama-server's answers: tests/e2e/orchestra/test_llamacpp_twin.py), plain and
streamed; refused with OpenAI's 400 naming the param where the body is malformed or the engine cannot take them
(`transformers serve`, a vLLM model without automatic tool choice), before any model is brought up for it."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import P4, gateway_key, running_lab
from tests.support.gateway_tools import WEATHER
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


FAST = {"load_s": 0.1, "warmup_s": 0.1, "wake_s": 0.1, "tokens_per_s": 400, "placeholder_mib": 1}


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}


MESSAGES = [{"role": "user", "content": "What is the weather in Lyon?"}]


def model(name: str, engine: str, gpu: int, **extra: object) -> dict:
    return {"name": name, "path": f"models/{name}", "engine": engine, "machine": "hub", "gpus": [gpu], "vram_gib": 1, **extra}


LAB = {
    "lab": "tools-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4] * 4}}],
    "models": [
        model("tooly", "sim-llamacpp", 0, path="models/tooly.Q4_K_M.gguf", sim=FAST),
        model("vl", "sim", 1, sim=FAST),
        model("hf-small", "transformers", 2),
        model("vectors", "sim", 3, serves="embedding", sim=FAST),  # never warmed: the fan-out must not bring it up
    ],
    "orchestra": {"warm": ["tooly", "vl"]},
    "gateway": {"machine": "hub"},
}


@pytest.fixture(scope="module")
def tools_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "tools") as demo:
        yield demo


@pytest.fixture
async def sdk(tools_lab):
    lab = load_lab(tools_lab.lab_path)
    async with FleetClient(lab, subscribe=[]) as fleet:
        await fleet.wait_connected(20)

        async def warm() -> bool:
            states = {m["name"]: m["state"] for m in (await fleet.call("hub", "models.list"))["models"]}
            return states["tooly"] == states["vl"] == "warm"

        await wait_for(warm, timeout=60, interval=0.2)
    key = gateway_key(tools_lab)
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0, timeout=60) as client:
        yield client


async def test_a_tool_call_plain_and_streamed(sdk):
    plain = await sdk.chat.completions.create(
        model="tooly", messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required", max_tokens=200
    )
    choice = plain.choices[0]
    assert choice.finish_reason == "tool_calls" and plain.model == "tooly"
    (call,) = choice.message.tool_calls or []
    arguments = json.loads(call.function.arguments)
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(arguments["city"], str) and arguments["unit"] in ("c", "f")

    named = await sdk.chat.completions.create(
        model="tooly",
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert [c.function.name for c in named.choices[0].message.tool_calls or []] == ["get_time"]

    stream = await sdk.chat.completions.create(
        model="tooly",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    heads, finish, usage = [], None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for part in chunk.choices:
            finish = part.finish_reason or finish
            for delta in part.delta.tool_calls or []:
                assert delta.index == 0
                if delta.id is not None:
                    heads.append((delta.id, delta.function.name if delta.function else None))
                pieces.append(delta.function.arguments or "" if delta.function else "")
    assert len(heads) == 1 and heads[0][1] == "get_weather" and finish == "tool_calls"
    assert len([p for p in pieces if p]) > 1  # the arguments come in pieces, as llama-server streams them
    assert json.loads("".join(pieces))["unit"] in ("c", "f") and usage is not None and usage.completion_tokens > 0


async def test_response_format_and_logprobs_pass_through(sdk):
    answer = await sdk.chat.completions.create(
        model="tooly",
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        logprobs=True,
        top_logprobs=2,
    )
    data = json.loads(answer.choices[0].message.content or "")
    assert isinstance(data["name"], str) and isinstance(data["age"], int) and isinstance(data["tags"], list)
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else []
    assert content and all(len(token.top_logprobs) == 2 for token in content)
    anything = await sdk.chat.completions.create(model="tooly", messages=MESSAGES, response_format={"type": "json_object"})
    assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)


async def test_what_an_engine_cannot_take_is_refused_naming_the_param(sdk, tools_lab):
    cases = [
        ("tooly", {"tools": "x"}, "tools"),
        ("tooly", {"tools": [{"type": "function"}]}, "tools[0].function"),
        ("tooly", {"tools": [WEATHER], "tool_choice": "bogus"}, "tool_choice"),
        ("tooly", {"tool_choice": "required"}, "tool_choice"),
        ("tooly", {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("tooly", {"top_logprobs": 2}, "top_logprobs"),
        # transformers serve refuses these itself: refused first, and the model is never brought up for it
        ("hf-small", {"response_format": {"type": "json_object"}}, "response_format"),
        ("hf-small", {"logprobs": True}, "logprobs"),
        # vLLM chooses a tool by itself only with --enable-auto-tool-choice and a parser in the model's args
        ("vl", {"tools": [WEATHER]}, "tool_choice"),
    ]
    for name, extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            await sdk.chat.completions.create(model=name, messages=MESSAGES, **extra)
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == param and body["type"] == "invalid_request_error", (extra, body)
        assert body["code"] is None or isinstance(body["code"], str)
    async with FleetClient(load_lab(tools_lab.lab_path), subscribe=[]) as fleet:
        await fleet.wait_connected(20)
        hf = await fleet.call("hub", "models.get", {"model": "hf-small"})
    assert hf["state"] not in ("warm", "loading")
    # what vLLM takes without a parser: "required" or a named function (guided decoding), streamed too
    forced = await sdk.chat.completions.create(model="vl", messages=MESSAGES, tools=[WEATHER], tool_choice="required")
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.id.startswith("chatcmpl-tool-") and json.loads(call.function.arguments)["unit"] in ("c", "f")
    assert forced.choices[0].finish_reason == "tool_calls"
    stream = await sdk.chat.completions.create(
        model="vl",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    pieces = [d.function.arguments or "" async for c in stream for p in c.choices for d in p.delta.tool_calls or [] if d.function]
    assert json.loads("".join(pieces))["unit"] in ("c", "f") and len(pieces) > 1


async def test_an_orchestra_member_takes_every_check_a_single_request_takes(sdk, tools_lab):
    """The fan-out's members go through the one exchange: a body OpenAI would refuse is refused for the whole call, and
    a member whose engine cannot take a parameter, or that serves another route, is refused naming it (before, the
    fan-out skipped these and sent them on, and brought an embedding model up for a chat prompt)."""
    lab = load_lab(tools_lab.lab_path)
    url, headers = f"{lab.gateway.url}/orchestra/chat/completions", {"Authorization": f"Bearer {gateway_key(tools_lab)}"}
    base = {"models": ["tooly", "hf-small", "vectors"], "messages": MESSAGES, "max_tokens": 24, "deadline_s": 30}
    async with aiohttp.ClientSession() as session:
        for extra, param in (({"temperature": "hot"}, "temperature"), ({"tools": "x"}, "tools")):  # the route's own checks
            async with session.post(url, json={**base, **extra}, headers=headers) as r:
                body = await r.json()
            assert r.status == 400 and body["error"]["param"] == param, body
        async with session.post(url, json={**base, "response_format": {"type": "json_object"}}, headers=headers) as r:
            assert r.status == 200
            data = await r.json()
    by_model = {res["model"]: res for res in data["results"]}
    assert by_model["tooly"]["status"] == "ok"
    assert isinstance(json.loads(by_model["tooly"]["choices"][0]["message"]["content"]), dict)
    refused = by_model["hf-small"]  # transformers serve takes no response_format
    assert (refused["status"], refused["http_status"], refused["param"]) == ("error", 400, "response_format"), refused
    other = by_model["vectors"]  # an embedding model answers /v1/embeddings
    assert (other["http_status"], other["param"]) == (400, "model") and "serves embedding" in other["error"], other
    assert data["answered"] == 1 and data["partial"] is True
    async with FleetClient(lab, subscribe=[]) as fleet:
        await fleet.wait_connected(20)
        states = {m["name"]: m["state"] for m in (await fleet.call("hub", "models.list"))["models"]}
    assert states["hf-small"] not in ("warm", "loading") and states["vectors"] not in ("warm", "loading")
