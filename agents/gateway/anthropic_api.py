"""Anthropic's Messages API (POST /v1/messages) answered by way of chat, so Anthropic-SDK clients reach the lab's
models: `system` and `messages` (text content) become chat messages, `max_tokens` (required, as Anthropic requires
it) chat's length, `stop_sequences` chat's stop; the answer is a `message`, the stream Anthropic's events
(message_start, content_block_start, content_block_delta ..., content_block_stop, message_delta, message_stop).
Every error on this route is in Anthropic's shape ({"type": "error", "error": {"type", "message"}}): the gateway
rewrites OpenAI's body into it in one place (anthropic_error), whatever raised it. Tools, images and documents are
refused naming the param (not mapped onto chat here), never dropped."""

from __future__ import annotations

import json
from typing import Any

from agents.gateway.mapped import MappedStream, chat_text, chat_usage, new_id, refuse, sse

PATH = "/v1/messages"
ACCEPTED = frozenset(
    {"model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k", "stream", "metadata"}
)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
# Anthropic's error types by status (its SDK raises its exception classes from the status)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _text(param: str, content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(param, f"{param} must be a string or a list of content blocks")
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise refuse(
                f"{param}[{j}].type", f"{param}[{j}]: a {str(kind)[:40]} block; only text blocks are mapped onto chat here"
            )
        texts.append(block["text"])
    return "".join(texts)


class MessagesMapping:
    """POST /v1/messages onto POST /v1/chat/completions."""

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        for name in body:
            if name not in ACCEPTED:
                raise refuse(name, f"{name[:60]}: not supported by this gateway's Messages API (not mapped onto chat)")
        if body.get("max_tokens") is None:
            raise refuse("max_tokens", "max_tokens: Field required", "missing_required_parameter")
        given = body.get("messages")
        if not isinstance(given, list) or not given:
            raise refuse("messages", "messages: a non-empty list of messages is required", "missing_required_parameter")
        messages = []
        if body.get("system") is not None:
            messages.append({"role": "system", "content": _text("system", body["system"])})
        for index, message in enumerate(given):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise refuse(f"messages.{index}.role", f"messages.{index}.role must be user or assistant")
            messages.append({"role": message["role"], "content": _text(f"messages.{index}.content", message.get("content"))})
        chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
        for name in ("temperature", "top_p", "top_k", "stream"):
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("stop_sequences") is not None:
            chat["stop"] = body["stop_sequences"]
        return chat

    def answer(self, chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        text, reason = chat_text(chat)
        prompt, completion = chat_usage(chat)
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": STOP_REASONS.get(reason or "stop", "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }

    def stream(self, body: dict[str, Any]) -> MappedStream:
        return MessagesStream(str(body["model"]))


class MessagesStream(MappedStream):
    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": self.client_model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message}) + sse(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        )

    def text(self, piece: str) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
        )

    def end(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        delta = {"stop_reason": STOP_REASONS.get(self.finish_reason or "stop", "end_turn"), "stop_sequence": None}
        usage = {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
        return (
            sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            + sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
            + sse("message_stop", {"type": "message_stop"})
        )

    def error(self, error: dict[str, Any]) -> bytes:
        self._ended = True
        return sse("error", {"type": "error", "error": {"type": "api_error", "message": str(error.get("message"))}})


def anthropic_error(status: int, raw: bytes) -> bytes:
    """An OpenAI-shaped error body (every error the gateway writes) in Anthropic's shape; the param named in the message."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        message = raw[:300].decode(errors="replace")
    else:
        message = str(error.get("message"))
        if error.get("param") and str(error["param"]) not in message:
            message = f"{error['param']}: {message}"
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
