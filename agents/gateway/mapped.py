"""APIs the gateway answers by way of chat: a Mapping turns the client's body into a chat body (refusing, with the
param named, what it cannot map, never dropping it), and chat's answer and stream back into the client's API. The
chat body then takes chat's own steps (checks, holds, lengths, metering), so a mapped route cannot skip any."""

from __future__ import annotations

import json
import secrets
from typing import Any, Protocol

from agents.gateway.limits import SseSplitter
from agents.gateway.target import NotServable


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def refuse(param: str, message: str, code: str = "invalid_parameter") -> NotServable:
    return NotServable(400, message, code, param=param)


def sse(kind: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as the Responses API and Anthropic's Messages API send them."""
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def chat_text(answer: dict[str, Any]) -> tuple[str, str | None]:
    """The first choice's text and finish_reason of a chat answer."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content") if isinstance(message, dict) else None
    reason = choice.get("finish_reason")
    return (content if isinstance(content, str) else ""), (reason if isinstance(reason, str) else None)


def chat_usage(answer: dict[str, Any]) -> tuple[int, int]:
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)


class MappedStream:
    """Chat's SSE in, the client API's events out: the meter's usage and token count are read as StreamRewriter
    reads them; subclasses say what to send at the start, for each piece of text, and at the end."""

    def __init__(self, client_model: str):
        self.client_model = client_model
        self.usage: dict[str, Any] | None = None
        self.token_events = 0
        self.finish_reason: str | None = None
        self._events = SseSplitter()
        self._started = self._ended = False

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._event(e) for e in self._events.feed(chunk.replace(b"\r\n", b"\n")))

    def flush(self) -> bytes:
        tail = self._events.rest()
        out = self._event(tail) if tail.strip() else b""
        return out + self._end()

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data:"):
            return b""
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return self._end()
        try:
            data = json.loads(payload)
        except ValueError:
            return b""
        if not isinstance(data, dict):
            return b""
        if isinstance(data.get("error"), dict):  # an engine's error mid-stream: passed on in the client's terms
            return self.error(data["error"])
        out = b""
        if not self._started:
            self._started = True
            out += self.start()
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        choices = data.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason") is None:
                self.token_events += 1
            else:
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(text, str) and text:
                out += self.text(text)
        return out

    def _end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        start = b"" if self._started else self.start()
        self._started = True
        prompt, completion = chat_usage({"usage": self.usage or {}})
        return start + self.end(prompt, completion or self.token_events)

    def start(self) -> bytes:
        raise NotImplementedError

    def text(self, piece: str) -> bytes:
        raise NotImplementedError

    def end(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        raise NotImplementedError

    def error(self, error: dict[str, Any]) -> bytes:
        raise NotImplementedError


class Mapping(Protocol):
    """One API answered by way of chat."""

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat body for the client's, or NotServable naming the param it cannot map."""

    def answer(self, chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The client API's answer for chat's (the client's body: its model name, its parameters echoed)."""

    def stream(self, body: dict[str, Any]) -> MappedStream:
        """The rewriter of chat's stream into the client API's events."""
