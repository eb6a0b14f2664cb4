"""What tests/e2e/gateway/test_stream_bytes.py, tests/fast/gateway/test_stream_bytes.py share: chunk, sse,
llama_chat_stream, run, decoded, parsed_only, both, CONTENTS."""

from __future__ import annotations

import json
from typing import Any

from agents.gateway.openai_api import StreamRewriter


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    """A chat chunk as the pinned llama-server writes it (nlohmann's sorted keys)."""
    choice = {"delta": delta if delta is not None else {}, "finish_reason": finish, "index": 0}
    return {
        "choices": [choice],
        "created": 1764000000,
        "id": "chatcmpl-Xy12",
        "model": "tiny",
        "object": "chat.completion.chunk",
        "system_fingerprint": "b1-abc",
        **top,
    }


def sse(*events: dict[str, Any] | str, separators: tuple[str, str] = (",", ":")) -> list[bytes]:
    return [
        b"data: "
        + (e.encode() if isinstance(e, str) else json.dumps(e, separators=separators, ensure_ascii=False).encode())
        + b"\n\n"
        for e in events
    ]


def llama_chat_stream(contents: list[str], usage: bool = True) -> list[dict[str, Any] | str]:
    events: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": None})]
    events += [chunk({"content": c}) for c in contents]
    events.append(chunk({}, finish="length"))
    if usage:
        events.append({**chunk(), "choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 9, "total_tokens": 13}})
    events.append("[DONE]")
    return events


def run(rewriter: StreamRewriter, chunks: list[bytes]) -> tuple[list[Any], int, Any]:
    """(each event written, decoded where it is JSON), the token events counted and the usage kept."""
    out = b"".join(rewriter.feed(c) for c in chunks) + rewriter.flush()
    events = [e.removeprefix(b"data: ") for e in out.split(b"\n\n") if e]
    return [decoded(e) for e in events], rewriter.token_events, rewriter.usage


def decoded(event: bytes) -> Any:
    try:
        return json.loads(event)
    except ValueError:  # [DONE], or an event the gateway passed on as it came
        return event


def parsed_only(rewriter: StreamRewriter) -> StreamRewriter:
    rewriter._as_bytes = lambda event: None  # type: ignore[method-assign]  # every event parsed: what the bytes must match
    return rewriter


def both(chunks: list[bytes], **kwargs: Any) -> tuple[tuple[list[Any], int, Any], tuple[list[Any], int, Any]]:
    kwargs = {"client_model": "tiny", "wants_usage": False, "chat": True, **kwargs}
    return run(StreamRewriter(**kwargs), chunks), run(parsed_only(StreamRewriter(**kwargs)), chunks)


CONTENTS = [
    "Once",
    " upon",
    ' a "model":"tiny" and "id":"x" inside',  # keys inside a string are escaped: still one model key, one id key
    ' "finish_reason":"stop" and "usage":{}',
    "naïve — ünïcödé ✓",
    "\\",
    "line\nbreak",
]
