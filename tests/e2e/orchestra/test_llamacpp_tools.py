"""Tool calling, response_format and logprobs on the REAL llama-server (the pinned build, --jinja on by default)
through the gateway, with the openai SDK, plain and streamed: a tiny random model that carries Qwen 2.5's chat
template (agents.orchestra.engines.llamacpp.chat_templates), so llama-server turns tools and schemas into grammars. Random weights
never choose to call a tool (Qwen's format lets text come before the <tool_call> tag), so the assistant's turn is
begun with the tag, as any client may begin it (llama-server continues a last assistant message): the grammar then
makes even random weights write a well-formed call of the tool, which llama-server parses into tool_calls.
A model without a template fails such grammars in llama-server's own words, which reach the client in OpenAI's."""

from __future__ import annotations

import json

import openai
import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.llamacpp import llama_server_or_skip, tiny_models
from tests.support.pool import settle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


# arguments a grammar bounds (an enum, a boolean): a random model reaches the end of the call
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "tomorrow": {"type": "boolean"}},
            "required": ["unit", "tomorrow"],
            "additionalProperties": False,
        },
    },
}


BEGUN = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "<tool_call>\n"}]


SCHEMA = {
    "type": "object",
    "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tools_lab(tmp_path_factory):
    llama_server_or_skip()
    models = tiny_models(tmp_path_factory.mktemp("gguf"))
    args = ["-c", "1024", "-t", "1", "--parallel", "2"]
    common = {"engine": "llamacpp", "machine": "box", "load_timeout_s": "60s", "args": args}
    lab = {
        "lab": "llama-tools",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {"name": "tiny-tools", "path": str(models["tools"]), **common},
            {"name": "tiny-plain", "path": str(models["a"]), **common},
        ],
        "gateway": {"machine": "box"},
    }
    source = tmp_path_factory.mktemp("toolsrc") / "lab.yaml"
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path_factory.mktemp("tools"), source=source) as demo:
        yield demo


@pytest.fixture
async def sdk(tools_lab):
    lab = load_lab(tools_lab.lab_path)
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(20)
        for name in ("tiny-tools", "tiny-plain"):
            await client.call("box", "models.warm", {"model": name})
            info = await settle(client, name, ("warm", "failed"), timeout=90)
            assert info["state"] == "warm", info["error"]
    key = (tools_lab.dir / "console" / "gateway.key").read_text().strip()
    async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0, timeout=120) as client:
        yield client


def weather_arguments(text: str) -> dict:
    arguments = json.loads(text)
    assert arguments["unit"] in ("c", "f") and isinstance(arguments["tomorrow"], bool), arguments
    return arguments


async def test_a_tool_call_on_the_real_llama_server_plain_and_streamed(sdk):
    plain = await sdk.chat.completions.create(
        model="tiny-tools", messages=BEGUN, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=256
    )
    calls = plain.choices[0].message.tool_calls or []
    assert calls and plain.model == "tiny-tools", plain
    for call in calls:  # each whole call is well formed; a last one may be cut by max_tokens (finish "length")
        assert call.type == "function" and call.function.name == "get_weather" and call.id
    weather_arguments(calls[0].function.arguments)
    assert plain.choices[0].finish_reason in ("tool_calls", "length")

    stream = await sdk.chat.completions.create(
        model="tiny-tools",
        messages=BEGUN,
        tools=[WEATHER],
        tool_choice="required",  # a named function with a begun turn: the pinned build fails to parse its own output
        parallel_tool_calls=False,
        max_tokens=256,
        stream=True,
        stream_options={"include_usage": True},
    )
    arguments: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str | None]] = {}
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
        for part in chunk.choices:
            for delta in part.delta.tool_calls or []:
                if delta.id is not None:
                    heads[delta.index] = (delta.id, delta.function.name if delta.function else None)
                arguments.setdefault(delta.index, []).append((delta.function.arguments or "") if delta.function else "")
    assert heads and heads[0][1] == "get_weather" and len(arguments[0]) > 1  # the arguments arrive in pieces
    weather_arguments("".join(arguments[0]))
    assert usage is not None and 0 < usage.completion_tokens <= 256


async def test_response_format_and_logprobs_on_the_real_llama_server(sdk):
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    answer = await sdk.chat.completions.create(
        model="tiny-tools",
        messages=[{"role": "user", "content": "Who?"}],
        response_format=schema,
        max_tokens=64,
        logprobs=True,
        top_logprobs=2,
    )
    data = json.loads(answer.choices[0].message.content or "")  # random weights, valid JSON of the schema
    assert isinstance(data["age"], int) and isinstance(data["ok"], bool) and answer.choices[0].finish_reason == "stop"
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else []
    assert content and all(len(token.top_logprobs) == 2 for token in content)
    pieces = []
    stream = await sdk.chat.completions.create(
        model="tiny-tools", messages=[{"role": "user", "content": "Who?"}], response_format=schema, max_tokens=64, stream=True
    )
    async for chunk in stream:
        pieces += [part.delta.content or "" for part in chunk.choices]
    assert isinstance(json.loads("".join(pieces))["ok"], bool)


async def test_llama_servers_own_error_reaches_the_client_in_openais_shape(sdk):
    # the template-less model's generation prompt starts with a space token the grammar cannot take: llama-server
    # answers {"error": {"code": 400, "message": "Failed to initialize samplers: ..."}}, no param
    with pytest.raises(openai.BadRequestError) as err:
        await sdk.chat.completions.create(
            model="tiny-plain", messages=[{"role": "user", "content": "hi"}], response_format={"type": "json_object"}
        )
    body = err.value.body
    assert isinstance(body, dict) and "Failed to initialize samplers" in body["message"]
    assert body["param"] == "response_format" and body["code"] is None and body["type"] == "invalid_request_error"
