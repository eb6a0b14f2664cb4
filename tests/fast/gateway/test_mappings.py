"""The mappings of the Responses and Messages APIs onto chat, and the pooling routes' checks, on any JSON a client can
send: a chat body, or a 400 naming a param; never another exception (which would be a 500), never a dropped field."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.gateway.anthropic_api import MessagesMapping, anthropic_error
from agents.gateway.responses_api import ResponsesMapping
from agents.gateway.routes import ROUTES
from agents.gateway.target import NotServable

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


PART = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text", "output_text", "input_image", 1]), "text": JSON})


MESSAGE = st.fixed_dictionaries(
    {"role": JSON | st.sampled_from(["user", "assistant", "system", "developer"]), "content": JSON | st.lists(PART, max_size=3)}
)


RESPONSES = st.fixed_dictionaries(
    {"model": st.just("m"), "input": JSON | st.lists(MESSAGE, max_size=3)},
    optional={"instructions": JSON, "text": JSON, "tools": JSON, "tool_choice": JSON, "max_output_tokens": JSON},
)


MESSAGES = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": JSON | st.lists(MESSAGE, max_size=3), "max_tokens": JSON},
    optional={"system": JSON | st.lists(PART, max_size=2), "stop_sequences": JSON, "tools": JSON},
)


def mapped_or_refused(mapping: Any, body: dict[str, Any]) -> None:
    try:
        chat = mapping.request(body)
    except NotServable as exc:
        assert exc.status == 400 and exc.param, exc.message
        return
    assert chat["model"] == "m" and isinstance(chat["messages"], list) and chat["messages"]
    assert all(isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant") for m in chat["messages"])
    json.dumps(chat)


@settings(max_examples=300, deadline=None)
@given(RESPONSES)
def test_responses_bodies_map_or_are_refused_naming_the_param(body):
    mapped_or_refused(ResponsesMapping(), body)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_messages_bodies_map_or_are_refused_naming_the_param(body):
    mapped_or_refused(MessagesMapping(), body)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["input", "query", "documents", "top_n", "encoding_format", "dimensions"]), JSON))
def test_pooling_bodies_pass_or_are_refused_naming_the_param(body):
    for route in ROUTES:
        if route.generates:
            continue
        try:
            route.check({"model": "m", **body})
        except NotServable as exc:
            assert exc.status == 400 and exc.param
        assert route.prompt({"model": "m", **body}) >= 1


def test_anthropic_errors_keep_the_param_in_the_message():
    raw = json.dumps({"error": {"message": "must be >= 1", "type": "invalid_request_error", "param": "max_tokens"}}).encode()
    assert json.loads(anthropic_error(400, raw)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: must be >= 1"},
    }
    assert json.loads(anthropic_error(529, b"<html>busy</html>"))["error"] == {
        "type": "overloaded_error",
        "message": "<html>busy</html>",
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(JSON | st.just({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}), max_size=6),
    st.binary(max_size=20),
)
def test_any_upstream_stream_maps_without_raising_and_ends_once(events, noise):
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + noise
    for mapped in (ResponsesMapping().stream({"model": "m", "input": "hi"}), MessagesMapping().stream({"model": "m"})):
        out = mapped.feed(raw) + mapped.flush() + mapped.flush()
        kinds = [line for line in out.split(b"\n") if line.startswith(b"event: ")]
        assert kinds, "a stream always starts and ends"
        ends = {b"event: response.completed", b"event: response.incomplete", b"event: message_stop", b"event: error"}
        assert sum(k in ends for k in kinds) == 1 and kinds[-1] in ends


def test_each_engine_is_started_to_serve_what_its_model_serves():
    from pathlib import Path

    from agents.orchestra.engines.llamacpp.engine import LlamacppEngine
    from agents.orchestra.engines.vllm.engine import VllmEngine
    from agents.wire.lab.model import Model

    def argv(kind: type, engine: str, serves: str) -> list[str]:
        model = Model.model_validate({"name": "m", "path": "/m/m.gguf", "machine": "x", "engine": engine, "serves": serves})
        return kind(model, Path(model.path), "x", [], Path("/tmp/m.log")).serve_flags()

    assert "--embedding" in argv(LlamacppEngine, "llamacpp", "embedding")
    assert "--reranking" in argv(LlamacppEngine, "llamacpp", "rerank")
    chat = argv(LlamacppEngine, "llamacpp", "chat")
    assert "--embedding" not in chat and "--reranking" not in chat
    vllm = argv(VllmEngine, "vllm", "embedding")
    assert vllm[vllm.index("--runner") + 1] == "pooling" and "--runner" not in argv(VllmEngine, "vllm", "chat")
