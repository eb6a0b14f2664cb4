"""A stream's events passed on as bytes where the gateway need not rewrite them: the same events, ids, names, roles,
usage and token counts as parsing each one gives, for llama-server's own chunks and for every shape that must be
parsed (usage, several choices, tool calls, keys and names inside content, whitespace, several lines)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.gateway.limits import SseSplitter, UpstreamTooLarge
from agents.gateway.openai_api import StreamRewriter
from tests.support.stream_bytes import CONTENTS, both, chunk, llama_chat_stream, run, sse


def test_events_needing_no_rewrite_pass_as_their_own_bytes():
    chunks = sse(*llama_chat_stream(["a", "b", "ünï"]))
    rewriter = StreamRewriter("tiny", wants_usage=False, chat=True, upstream_model="tiny")
    out = [rewriter.feed(c) for c in chunks]
    assert out[1:5] == chunks[1:5]  # the deltas and the finish, byte for byte (the non-ASCII left as UTF-8)
    assert json.loads(out[0].removeprefix(b"data: "))["choices"][0]["delta"]["role"] == "assistant"
    assert out[5] == b""  # the usage chunk the gateway asked for, not the client


def test_a_served_name_or_a_route_prefix_is_changed_in_place():
    chunks = sse(*[{**e, "model": "org/Tiny-7B"} if isinstance(e, dict) else e for e in llama_chat_stream(["a"])])
    rewriter = StreamRewriter("tiny", wants_usage=False, chat=False, upstream_model="org/Tiny-7B")
    out = [rewriter.feed(c) for c in chunks]
    assert out[1] == chunks[1].replace(b'"model":"org/Tiny-7B"', b'"model":"tiny"').replace(b'"chatcmpl-', b'"cmpl-')


def test_a_chat_stream_with_no_role_gets_one_in_each_choices_first_chunk():
    events = [chunk({"content": "a"}), chunk({"content": "b"}), chunk({}, finish="stop")]
    fast, slow = both(sse(*events))
    assert fast == slow
    assert fast[0][0]["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert "role" not in fast[0][1]["choices"][0]["delta"]


def test_several_choices_are_parsed_for_each_ones_role():
    def choice(index: int, content: str) -> dict[str, Any]:
        return {
            **chunk({"content": content}),
            "choices": [{"delta": {"content": content}, "finish_reason": None, "index": index}],
        }

    events = [choice(0, "a"), choice(1, "b"), choice(0, "c"), choice(1, "d")]
    fast, slow = both(sse(*events), choices=2)
    assert fast == slow
    assert [e["choices"][0]["delta"].get("role") for e in fast[0]] == ["assistant", "assistant", None, None]
    assert fast[1] == 4


@pytest.mark.parametrize(
    "odd",
    [
        {
            "choices": [
                {
                    "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]},
                    "finish_reason": None,
                    "index": 0,
                }
            ]
        },
        {"choices": [{"delta": {"content": "x"}, "index": 0}]},  # no finish_reason key: still generating
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], "id": "cmpl-7"},  # the other prefix
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], "id": "resp_7"},  # a provider's id
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], "model": "someone-else"},
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], "usage": None},
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0, "logprobs": {"model": 1}}]},
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], 'x"model': "tiny"},
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0}], "timings": {"predicted_n": 3}},
        {"choices": [{"delta": {"content": "x"}, "finish_reason": None, "index": 0, "logprobs": {"model": "tiny.gguf"}}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "chatcmpl-c", "index": 0}]}, "finish_reason": None, "index": 0}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "cmpl-c", "index": 0}]}, "finish_reason": None, "index": 0}]},
        {"choices": [{"delta": {}, "finish_reason": None, "index": 0}, {"delta": {}, "finish_reason": None, "index": 1}]},
        {"choices": [], "error": {"message": "slot failed"}},
        {"error": {"message": "no choices at all"}},
    ],
)
def test_chunks_of_any_other_shape_come_out_as_parsing_them_gives(odd: dict[str, Any]):
    events = [chunk({"role": "assistant", "content": None}), {**chunk({"content": "x"}), **odd}, chunk({"content": "y"})]
    for upstream in ("tiny", "tiny.gguf"):
        named = [{**e, "model": upstream} if "model" not in odd else e for e in events]
        for chat in (True, False):
            fast, slow = both(sse(*named), chat=chat, upstream_model=upstream)
            assert fast == slow, (chat, upstream, odd)


def test_spaced_json_and_several_lines_are_parsed():
    events = llama_chat_stream(["a", "b"])
    spaced = sse(*events, separators=(", ", ": "))  # Python's json.dumps default, as the sim engines write
    fast, slow = both(spaced, chat=False)
    assert fast == slow and all(e["id"] == "cmpl-Xy12" for e in fast[0] if isinstance(e, dict))
    two_lines = [
        b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null,"index":0}],\ndata: "id":"chatcmpl-1","model":"tiny"}\n\n'
    ]
    fast, slow = both(sse(*events[:1]) + two_lines)
    assert fast == slow


def test_events_split_anywhere_come_out_the_same():
    whole = b"".join(sse(*llama_chat_stream(CONTENTS)))
    expected = run(StreamRewriter("tiny", False, chat=True, upstream_model="tiny"), [whole])
    for size in (1, 2, 3, 7, 64, 200):
        pieces = [whole[i : i + size] for i in range(0, len(whole), size)]
        assert run(StreamRewriter("tiny", False, chat=True, upstream_model="tiny"), pieces) == expected, size
    crlf = [c.replace(b"\n", b"\r\n") for c in sse(*llama_chat_stream(CONTENTS))]
    assert run(StreamRewriter("tiny", False, chat=True, upstream_model="tiny"), crlf) == expected


def test_the_splitter_takes_a_lone_whole_event_and_still_caps_a_growing_one():
    splitter = SseSplitter(max_event_bytes=16)
    assert splitter.feed(b"data: 1\n\n") == [b"data: 1"]
    assert splitter.feed(b"\n") == [] and splitter.feed(b"\n") == [b""]
    assert splitter.feed(b"data: 2\n\ndata: 3\n\n") == [b"data: 2", b"data: 3"]
    assert splitter.feed(b"d") == [] and splitter.feed(b"ata: 4\n\n") == [b"data: 4"]
    with pytest.raises(UpstreamTooLarge):
        splitter.feed(b"data: " + b"x" * 20)
