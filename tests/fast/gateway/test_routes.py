"""The gateway's other routes driven by the real clients, against both simulators: /v1/responses (plain and streamed,
the openai SDK accumulating the events), /v1/embeddings (the SDK's default base64 and floats), /v1/rerank (Jina's and
Cohere's body), Anthropic's /v1/messages (the anthropic SDK, plain and streamed, its key as x-api-key, its error
classes); a route asked of a model that does not serve it is refused naming `model`; each request is held and metered
as chat is; a key limited to one model is refused the others on every route."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.timeout(240)


def chat_stream(pieces: list[str], reason: str) -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(pieces)}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def test_a_finished_answer_streams_as_the_openai_sdk_accumulates_it():
    """A chat stream that ends by itself becomes the Responses events the SDK's own accumulator completes."""
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    from agents.gateway.responses_api import ResponsesMapping

    mapped = ResponsesMapping().stream({"model": "talk", "input": "hi"})
    raw = chat_stream(["Hel", "lo", " there"], "stop")
    out = b"".join(mapped.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)) + mapped.flush()  # any chunking
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    kinds = []
    for block in out.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        event = construct_type(type_=ResponseStreamEvent, value=json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {event.type}"
        kinds.append(event.type)
        state.handle_event(event)
    final = state._completed_response
    assert kinds[-1] == "response.completed" and final is not None and final.output_text == "Hello there"
    assert final.usage.input_tokens == 7 and final.usage.output_tokens == 3 and final.status == "completed"
    assert mapped.usage == {"prompt_tokens": 7, "completion_tokens": 3}
