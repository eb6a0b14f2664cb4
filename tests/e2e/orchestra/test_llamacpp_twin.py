"""The simulators against what they stand in for: one request matrix, run against the REAL pinned llama-server and
against sim-llamacpp, compared by what each answer means (choices, finish reasons, stop honoured, token counts
within the limit, error status and type, logprobs shape, streams completing), never by the random text. The vLLM
simulator answers the same matrix as vLLM documents it (its protocol's validators and SamplingParams' checks)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import aiohttp
import pytest

from agents.orchestra.engine import free_port
from tests.support.llamacpp import llama_server_or_skip, tiny_models
from tests.support.llamacpp_twin import post, start

pytestmark = pytest.mark.timeout(300)


SLOTS = 2  # both servers run with --parallel 2: n above it is refused


STOPS = ["e", "a", "o", "i", "n"]  # a random model meets one of these within a few tokens


CHAT = "/v1/chat/completions"


COMPLETIONS = "/v1/completions"


STREAMS = 200


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Say something about the lab."}], **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"prompt": "The lab keeps its models warm because", **extra}


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


# (name, route, body): each answered by both servers; the body is sent as JSON unless it is bytes
MATRIX: list[tuple[str, str, Any]] = []


for _route, _make in ((CHAT, chat), (COMPLETIONS, completion)):
    _kind = "chat" if _route == CHAT else "completions"
    for _stream in (False, True):
        _s = {"stream": True, "stream_options": {"include_usage": True}} if _stream else {}
        _tag = f"{_kind}{'-stream' if _stream else ''}"
        MATRIX += [
            (f"{_tag}-max_tokens", _route, _make(max_tokens=3, **_s)),
            (f"{_tag}-max_completion_tokens", _route, _make(max_completion_tokens=3, **_s)),
            (f"{_tag}-max_completion_tokens-first", _route, _make(max_completion_tokens=2, max_tokens=5, **_s)),
            (f"{_tag}-n", _route, _make(max_tokens=3, n=2, **_s)),
            (f"{_tag}-stop-list", _route, _make(max_tokens=64, stop=STOPS, **_s)),
            (f"{_tag}-stop-string", _route, _make(max_tokens=64, stop=" ", **_s)),
            (f"{_tag}-n-stop", _route, _make(max_tokens=64, n=2, stop=STOPS, **_s)),
            (f"{_tag}-max_tokens-zero", _route, _make(max_tokens=0, **_s)),
            (f"{_tag}-n-zero", _route, _make(max_tokens=3, n=0, **_s)),
            (f"{_tag}-n-over-slots", _route, _make(max_tokens=3, n=SLOTS + 1, **_s)),
            (f"{_tag}-n-type", _route, _make(max_tokens=3, n="two", **_s)),
            (f"{_tag}-max_tokens-negative", _route, _make(max_tokens=-5, **_s)),
            (f"{_tag}-max_completion_tokens-negative", _route, _make(max_completion_tokens=-5, **_s)),
            (f"{_tag}-max_tokens-type", _route, _make(max_tokens="many", **_s)),
            (f"{_tag}-seed-type", _route, _make(max_tokens=3, seed="x", **_s)),
            (f"{_tag}-stop-item-type", _route, _make(max_tokens=3, stop=["a", 1], **_s)),
            (f"{_tag}-temperature-type", _route, _make(max_tokens=3, temperature="hot", **_s)),
        ]
        if _route == CHAT:
            MATRIX += [
                (f"{_tag}-logprobs-top", _route, _make(max_tokens=3, logprobs=True, top_logprobs=2, **_s)),
                (f"{_tag}-logprobs-default-top", _route, _make(max_tokens=2, logprobs=True, **_s)),
                (f"{_tag}-logprobs-top-zero", _route, _make(max_tokens=2, logprobs=True, top_logprobs=0, **_s)),
                (f"{_tag}-top-without-logprobs", _route, _make(max_tokens=2, top_logprobs=2, **_s)),
            ]
        else:
            MATRIX += [
                (f"{_tag}-logprobs", _route, _make(max_tokens=3, logprobs=2, **_s)),
                (f"{_tag}-logprobs-zero", _route, _make(max_tokens=3, logprobs=0, **_s)),
            ]


# tools, tool_choice and response_format (the model carries Qwen 2.5's chat template: llama-server's --jinja path
# reads its tool section): malformed ones answered in llama-server's words, schemas written as valid JSON
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


BOUNDED = {  # a schema whose every value a grammar bounds: a random model reaches its end
    "type": "object",
    "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["age", "ok"],
    "additionalProperties": False,
}


for _stream in (False, True):
    _s = {"stream": True, "stream_options": {"include_usage": True}} if _stream else {}
    _tag = f"chat{'-stream' if _stream else ''}"
    MATRIX += [
        (f"{_tag}-json_schema", CHAT, chat(max_tokens=256, response_format=_json_schema(BOUNDED), **_s)),
        (f"{_tag}-json_schema-cut", CHAT, chat(max_tokens=1, response_format=_json_schema(BOUNDED), **_s)),
        (f"{_tag}-json_object-cut", CHAT, chat(max_tokens=3, response_format={"type": "json_object"}, **_s)),
        (f"{_tag}-response_format-text", CHAT, chat(max_tokens=3, response_format={"type": "text"}, **_s)),
        (f"{_tag}-tools-auto", CHAT, chat(max_tokens=3, tools=[WEATHER], **_s)),
        (f"{_tag}-tools-type", CHAT, chat(max_tokens=3, tools="x", **_s)),
        (f"{_tag}-tools-no-function", CHAT, chat(max_tokens=3, tools=[{"type": "function"}], **_s)),
        (f"{_tag}-tool_choice-bogus", CHAT, chat(max_tokens=3, tools=[WEATHER], tool_choice="bogus", **_s)),
        (f"{_tag}-response_format-type", CHAT, chat(max_tokens=3, response_format={"type": "yaml"}, **_s)),
    ]


MATRIX += [
    ("stream-type", CHAT, chat(max_tokens=3, stream="yes")),
    ("messages-type", CHAT, {"messages": "hello", "max_tokens": 3}),
    ("messages-missing", CHAT, {"max_tokens": 3}),
    ("prompt-missing", COMPLETIONS, {"max_tokens": 3}),
    ("prompt-type", COMPLETIONS, {"prompt": 5, "max_tokens": 3}),
    ("body-array", CHAT, [1]),
    ("body-not-json", CHAT, b"{not json"),
]


def events(raw: bytes) -> tuple[list[dict[str, Any]], bool]:
    """A stream's data events, and whether it ended with [DONE]."""
    out, done = [], False
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        data = block[6:].strip()
        if data == b"[DONE]":
            done = True
        else:
            out.append(json.loads(data))
    return out, done


def limit_of(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(name), int):
            return max(1, body[name])
    return None


def logprobs_shape(entries: list[dict[str, Any]]) -> tuple[Any, ...]:
    """The keys of a token's entry and how many alternatives each lists (the values are the model's)."""
    return (
        tuple(sorted({key for e in entries for key in e})),
        tuple(sorted({key for e in entries for top in e["top_logprobs"] for key in top})),
        tuple(sorted({len(e["top_logprobs"]) for e in entries})),
    )


def meaning(status: int, raw: bytes, body: Any) -> dict[str, Any]:
    """What an answer means, with the random text left out."""
    if status != 200:
        error = json.loads(raw)["error"]
        named = [
            f
            for f in ("n", "max_tokens", "max_completion_tokens", "seed", "stop", "stream", "temperature")
            if f"'{f}'" in error["message"]
        ]
        return {"status": status, "type": error["type"], "names": named}
    asked = body if isinstance(body, dict) else {}
    stops = [asked["stop"]] if isinstance(asked.get("stop"), str) else asked.get("stop") or []
    limit = limit_of(asked)
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    entries: dict[int, list[dict[str, Any]]] = {}
    logprobs_keys: set[bool] = set()
    if asked.get("stream"):
        chunks, done = events(raw)
        usages = [c["usage"] for c in chunks if c.get("usage")]
        roles = sum(1 for c in chunks for ch in c["choices"] if "role" in ch.get("delta", {}))
        for chunk in chunks:
            for choice in chunk["choices"]:
                index = choice["index"]
                texts[index] = texts.get(index, "") + (choice.get("text") or (choice.get("delta") or {}).get("content") or "")
                if choice.get("finish_reason"):
                    finish[index] = choice["finish_reason"]
                if (choice.get("logprobs") or {}).get("content"):
                    entries.setdefault(index, []).extend(choice["logprobs"]["content"])
        shape: dict[str, Any] = {"done": done, "role_chunks": roles, "usage_chunks": len(usages)}
    else:
        answer = json.loads(raw)
        usages = [answer["usage"]]
        for choice in answer["choices"]:
            index = choice["index"]
            texts[index] = choice["message"]["content"] if "message" in choice else choice["text"]
            finish[index] = choice["finish_reason"]
            logprobs_keys.add("logprobs" in choice and choice["logprobs"] is not None)
            if choice.get("logprobs"):
                entries[index] = choice["logprobs"]["content"]
        shape = {"object": answer["object"], "logprobs_given": sorted(logprobs_keys)}
    tokens = [u["completion_tokens"] for u in usages]
    if _asks_json(asked) and limit is not None and limit <= 3 and len(finish) == 1:
        # cut short under a JSON grammar: random weights decide whether the object closes first ("{}" is two tokens),
        # so either end is lawful: the limit reached, or valid JSON that stopped by itself; which one is not compared
        (reason,) = finish.values()
        lawful = (reason == "length" and tokens == [limit]) or (reason == "stop" and _json_kind(texts[0]) != "not json")
        finish = {0: "length or JSON" if lawful else f"unlawful {reason}"}
        texts = {0: ""}
    return {
        "status": 200,
        **shape,
        "choices": sorted(texts),
        "finish": sorted(finish.values()),
        "stop_honoured": all(stop not in text for text in texts.values() for stop in stops),
        "within_limit": limit is None or all(t <= limit for t in tokens),
        "at_limit_when_length": all(t == limit for t in tokens) if limit and set(finish.values()) == {"length"} else None,
        "logprobs": sorted(logprobs_shape(e) for e in entries.values()),
        "one_entry_per_token": [len(e) for e in entries.values()] == [len(entries[0])] * len(entries) if entries else None,
        # a schema's answer that ended by itself is valid JSON of it (the grammar's work); one cut short is not asked
        "json": sorted(_json_kind(text) for text in texts.values())
        if _asks_json(asked) and set(finish.values()) == {"stop"}
        else None,
    }


def _asks_json(body: dict[str, Any]) -> bool:
    fmt = body.get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


def _json_kind(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return "not json"
    return type(value).__name__ + ":" + ",".join(sorted(f"{k}={type(v).__name__}" for k, v in value.items()))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    binary = llama_server_or_skip()
    model = tiny_models(tmp_path_factory.mktemp("gguf"))["tools"]
    real_port, sim_port = free_port(), free_port()
    common = ["-m", str(model), "--alias", "tiny", "-c", "2048", "--parallel", str(SLOTS)]
    real = start([str(binary), *common, "--port", str(real_port), "-t", "1"], real_port)
    sim = start(
        [
            sys.executable,
            "-m",
            "agents.orchestra.engines.llamacpp.twin",
            *common,
            "--port",
            str(sim_port),
            "--sim-load-s",
            "0",
            "--sim-warmup-s",
            "0",
            "--sim-tokens-per-s",
            "500",
            "--sim-parent-pid",
            str(os.getpid()),
        ],
        sim_port,
    )
    yield f"http://127.0.0.1:{real_port}", f"http://127.0.0.1:{sim_port}"
    for proc in (real, sim):
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("name, route, body", MATRIX, ids=[m[0] for m in MATRIX])
def test_sim_llamacpp_means_what_llama_server_means(servers, name, route, body):
    real, sim = servers
    expected = meaning(*post(real, route, body), body)
    got = meaning(*post(sim, route, body), body)
    assert got == expected, f"{name}: the real llama-server answered {expected}, sim-llamacpp {got}"
    if expected["status"] == 200:  # the matrix asks what it means to ask: a check that passes on nothing proves nothing
        assert expected["stop_honoured"] and expected["within_limit"] and expected.get("done", True)


def tool_call_meaning(status: int, raw: bytes, stream: bool) -> dict[str, Any]:
    """What a tool-call answer means: the first call's function, whether its arguments are valid JSON of the tool's
    schema, the deltas' shape (the call's id and name once, then its arguments in pieces)."""
    assert status == 200, raw
    if not stream:
        message = json.loads(raw)["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        first = calls[0] if calls else {}
        return {"name": first.get("function", {}).get("name"), "arguments": _weather(first.get("function", {}).get("arguments"))}
    chunks, done = events(raw)
    deltas = [
        d for c in chunks for ch in c["choices"] for d in (ch.get("delta") or {}).get("tool_calls") or [] if d["index"] == 0
    ]
    heads = [d for d in deltas if "id" in d]
    return {
        "name": heads[0]["function"]["name"] if heads else None,
        "arguments": _weather("".join(d["function"].get("arguments", "") for d in deltas)),
        "one_head": len(heads) == 1 and heads[0]["type"] == "function" and deltas[0] is heads[0],
        "pieces": len(deltas) > 1,
        "done": done,
    }


def _weather(text: object) -> bool:
    try:
        value = json.loads(str(text))
    except ValueError:
        return False
    return value.get("unit") in ("c", "f") and isinstance(value.get("tomorrow"), bool)


@pytest.mark.parametrize("stream", [False, True])
def test_sim_llamacpp_calls_a_tool_as_llama_server_does(servers, stream):
    # the assistant's turn begun with Qwen's tag: random weights then write the call the grammar allows
    body = {
        "messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "<tool_call>\n"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 256,
        **({"stream": True} if stream else {}),
    }
    real, sim = servers
    expected = tool_call_meaning(*post(real, CHAT, body), stream)
    assert tool_call_meaning(*post(sim, CHAT, body), stream) == expected
    assert expected["name"] == "get_weather" and expected["arguments"]


@pytest.mark.parametrize("route, make", [(CHAT, chat), (COMPLETIONS, completion)])
def test_same_seed_same_text_and_choice_i_draws_seed_plus_i(servers, route, make):
    def texts(base: str, **extra: Any) -> list[str]:
        status, raw = post(base, route, make(max_tokens=6, seed=42, temperature=1.0, **extra))
        assert status == 200, raw
        return [c["message"]["content"] if "message" in c else c["text"] for c in json.loads(raw)["choices"]]

    for base in servers:
        first, again, pair = texts(base), texts(base), texts(base, n=2)
        assert first == again and pair[0] == first[0] and pair[1] != pair[0], base


def test_two_hundred_concurrent_streams_all_complete(servers):
    async def one(session: aiohttp.ClientSession, base: str) -> bool:
        body = chat(max_tokens=4, stream=True, stream_options={"include_usage": True})
        async with session.post(base + CHAT, json=body) as response:
            raw = await response.read()
        chunks, done = events(raw)
        return response.status == 200 and done and any(c.get("usage") for c in chunks)

    async def burst(base: str) -> int:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=240)) as session:
            return sum(await asyncio.gather(*(one(session, base) for _ in range(STREAMS))))

    real, sim = servers
    assert asyncio.run(burst(real)) == STREAMS
    assert asyncio.run(burst(sim)) == STREAMS


# ---------------------------------------------------------------------------- the vLLM simulator against vLLM's documents

# what vLLM 0.33 refuses with a 400 naming the param: SamplingParams._verify_args (n, max_tokens at least 1), the
# request models' pydantic types and check_logprobs validator, the required messages / prompt, a body not an object
VLLM_REFUSES = {
    "n-zero": "n",
    "max_tokens-zero": "max_tokens",
    "max_tokens-negative": "max_tokens",
    "max_completion_tokens-negative": "max_completion_tokens",
    "n-type": "n",
    "max_tokens-type": "max_tokens",
    "seed-type": "seed",
    "stop-item-type": "stop",
    "temperature-type": "temperature",
    "top-without-logprobs": "top_logprobs",
    "messages-type": "messages",
    "messages-missing": "messages",
    "prompt-missing": "prompt",
    "prompt-type": "prompt",
    "tools-type": "tools",
    "tools-no-function": "tools",
    "tool_choice-bogus": "tool_choice",
    "response_format-type": "response_format",
    "tools-auto": "tool_choice",  # "auto" needs --enable-auto-tool-choice and a --tool-call-parser
    "body-array": "body",
    "body-not-json": "body",
}


@pytest.fixture(scope="module")
def vllm_sim(tmp_path_factory):
    model = tmp_path_factory.mktemp("vllm-model")
    (model / "weights.bin").write_bytes(b"x" * 1024)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "agents.orchestra.engines.vllm.twin",
        str(model),
        "--port",
        str(port),
        "--served-model-name",
        "sim",
    ]
    argv += ["--load-s", "0", "--warmup-s", "0", "--tokens-per-s", "500", "--parent-pid", str(os.getpid())]
    proc = start(argv, port)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def vllm_answer_holds(name: str, body: Any, status: int, raw: bytes) -> None:
    """The sim's answer is what vLLM documents for this request."""
    refused = next((param for suffix, param in VLLM_REFUSES.items() if name.endswith(suffix)), None)
    if refused is not None:
        error = json.loads(raw)["error"]
        assert status == 400 and error["type"] == "BadRequestError" and error["param"].split(".")[0] == refused, (name, raw)
        return
    assert status == 200, (name, raw)
    chat = "messages" in body
    n = body.get("n", 1)
    stops = [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or []
    limit = limit_of(body)
    count = (body.get("top_logprobs") or 0) if chat and body.get("logprobs") else body.get("logprobs") if not chat else None
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    logprobs: dict[int, list[Any]] = {}
    if body.get("stream"):
        chunks, done = events(raw)
        assert done, name
        usages = [c["usage"] for c in chunks if c.get("usage")]
        for chunk in chunks:
            for choice in chunk["choices"]:
                i = choice["index"]
                texts[i] = texts.get(i, "") + (choice.get("text") or (choice.get("delta") or {}).get("content") or "")
                finish[i] = choice.get("finish_reason") or finish.get(i, "")
                if choice.get("logprobs"):
                    logprobs.setdefault(i, []).append(choice["logprobs"])
    else:
        answer = json.loads(raw)
        usages = [answer["usage"]]
        for choice in answer["choices"]:
            i = choice["index"]
            texts[i] = choice["message"]["content"] if chat else choice["text"]
            finish[i] = choice["finish_reason"]
            if choice["logprobs"] is not None:
                logprobs[i] = [choice["logprobs"]]
    assert sorted(texts) == list(range(n)) and set(finish.values()) <= {"length", "stop"}, (name, finish)
    fmt = body.get("response_format") or {}
    if fmt.get("type") in ("json_object", "json_schema") and set(finish.values()) == {"stop"}:  # guided decoding's JSON
        assert all(isinstance(json.loads(text), dict) for text in texts.values()), name
    assert all(stop not in text for text in texts.values() for stop in stops), name
    if stops:
        assert set(finish.values()) == {"stop"}, name
    assert limit is None or all(u["completion_tokens"] <= limit * n for u in usages), name  # vLLM's usage sums the n
    if count is None:
        assert not logprobs, name
        return
    assert sorted(logprobs) == list(range(n)), name
    for parts in logprobs.values():
        for part in parts:
            if chat:
                assert all(len(e["top_logprobs"]) == count and {"token", "logprob", "bytes"} <= set(e) for e in part["content"])
            else:
                lists = (part["tokens"], part["token_logprobs"], part["text_offset"], part["top_logprobs"])
                assert len({len(x) for x in lists}) == 1 and all(len(top) == count for top in part["top_logprobs"]), name


@pytest.mark.parametrize("name, route, body", MATRIX, ids=[m[0] for m in MATRIX])
def test_vllm_sim_answers_as_vllm_documents(vllm_sim, name, route, body):
    if isinstance(body, dict):
        body = {**body, "model": "sim"}
    vllm_answer_holds(name, body if isinstance(body, dict) else {}, *post(vllm_sim, route, body))


def test_vllm_sim_two_hundred_concurrent_streams_and_seeds(vllm_sim):
    async def one(session: aiohttp.ClientSession) -> bool:
        body = chat(model="sim", max_tokens=4, stream=True, stream_options={"include_usage": True})
        async with session.post(vllm_sim + CHAT, json=body) as response:
            raw = await response.read()
        return response.status == 200 and events(raw)[1]

    async def burst() -> int:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return sum(await asyncio.gather(*(one(session) for _ in range(STREAMS))))

    assert asyncio.run(burst()) == STREAMS
    seeded = [post(vllm_sim, COMPLETIONS, completion(model="sim", max_tokens=6, seed=7, n=2))[1] for _ in range(2)]
    texts = [[c["text"] for c in json.loads(raw)["choices"]] for raw in seeded]
    assert texts[0] == texts[1] and texts[0][0] != texts[0][1]


def sdk_meaning(base: str) -> dict[str, Any]:
    """The openai SDK's calls on one server, read as its types parse them."""
    import openai

    sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages: Any = [{"role": "user", "content": "Say something about the lab."}]
    pair = sdk.chat.completions.create(model="tiny", messages=messages, n=2, max_completion_tokens=3, seed=5)
    stopped = sdk.chat.completions.create(model="tiny", messages=messages, stop=STOPS, max_tokens=64)
    chunks = list(
        sdk.chat.completions.create(
            model="tiny", messages=messages, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    tops = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=2, logprobs=True, top_logprobs=3)
    text = sdk.completions.create(model="tiny", prompt="The lab", max_tokens=3, n=2)
    try:
        sdk.chat.completions.create(model="tiny", messages=messages, n=0)
        refused = None
    except openai.APIStatusError as exc:
        refused = (type(exc).__name__, exc.status_code)
    content = tops.choices[0].logprobs.content if tops.choices[0].logprobs else None
    return {
        "pair": ([c.finish_reason for c in pair.choices], pair.usage is not None and pair.usage.completion_tokens <= 3),
        "stopped": (stopped.choices[0].finish_reason, not any(s in (stopped.choices[0].message.content or "") for s in STOPS)),
        "stream": (
            [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
            [c.usage.completion_tokens for c in chunks if c.usage],
        ),
        "top_logprobs": None if content is None else [len(t.top_logprobs) for t in content],
        "completions": [c.finish_reason for c in text.choices],
        "refused": refused,
    }


def test_the_openai_sdk_reads_sim_llamacpp_as_it_reads_llama_server(servers):
    real, sim = servers
    expected = sdk_meaning(real)
    assert sdk_meaning(sim) == expected
    assert expected["refused"] == ("BadRequestError", 400) and expected["top_logprobs"] == [3, 3]
