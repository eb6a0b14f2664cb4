"""OpenAI's Responses API (POST /v1/responses) answered by way of chat: `input` (a string, or messages whose content
is text parts) and `instructions` become chat messages, `max_output_tokens` chat's length, `text.format` chat's
response_format; the answer is a `response` object, and the stream the event sequence the openai SDK's
`responses.create(stream=True)` accumulates (response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done, response.completed).
The gateway stores no responses: `previous_response_id` is refused, and an answer says `store: false`. Tools, files
and images are refused naming the param (not mapped onto chat here), never dropped."""

from __future__ import annotations

import time
from typing import Any

from agents.gateway.mapped import MappedStream, chat_text, chat_usage, new_id, refuse, sse

# what a Responses body may carry; anything else is refused by name
ACCEPTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "stream_options",
        "text",
        "store",
        "metadata",
        "user",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "truncation",
        "service_tier",
        "seed",
    }
)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


def _content(index: int, content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refuse(f"input[{index}].content", f"input[{index}].content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise refuse(
                f"input[{index}].content[{j}].type",
                f"input[{index}].content[{j}]: only text parts ({', '.join(TEXT_PARTS)}) are mapped onto chat by this gateway",
            )
        texts.append(part["text"])
    return "".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    given = body.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        items = given
    else:
        raise refuse("input", "input is required: a string or a non-empty list of messages", "missing_required_parameter")
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise refuse("instructions", "instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise refuse(f"input[{index}]", f"input[{index}] must be an object")
        if item.get("type", "message") != "message":
            raise refuse(
                f"input[{index}].type",
                f"input[{index}] is a {str(item.get('type'))[:40]} item: only messages are mapped onto chat by this gateway",
            )
        role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
        if role is None:
            raise refuse(f"input[{index}].role", f"input[{index}].role must be one of {', '.join(ROLES)}")
        messages.append({"role": role, "content": _content(index, item.get("content"))})
    return messages


def _response_format(text: object) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt, dict):
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise refuse("text.format.type", "text.format.type must be text, json_object or json_schema")


class ResponsesMapping:
    """POST /v1/responses onto POST /v1/chat/completions."""

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        for name in body:
            if name not in ACCEPTED:
                raise refuse(name, f"{name[:60]} is not supported by this gateway's Responses API (it keeps no state)")
        if body.get("tools"):
            raise refuse("tools", "tools are not mapped onto chat by this gateway's Responses API")
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise refuse("tool_choice", "tool_choice must be none or auto (no tools are mapped)")
        chat: dict[str, Any] = {"model": body["model"], "messages": _messages(body)}
        for name in ("temperature", "top_p", "stream", "seed", "user"):
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        response_format = _response_format(body.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        return chat

    def answer(self, chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        text, reason = chat_text(chat)
        prompt, completion = chat_usage(chat)
        return response_object(body, new_id("resp_"), new_id("msg_"), text, reason, prompt, completion)

    def stream(self, body: dict[str, Any]) -> MappedStream:
        return ResponsesStream(body)


def _message(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def response_object(
    body: dict[str, Any],
    response_id: str,
    item_id: str,
    text: str | None,
    reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    created_at: float | None = None,
) -> dict[str, Any]:
    """A `response` object: in progress while text is None, else completed (incomplete when the length ran out)."""
    status = "in_progress" if text is None else "incomplete" if reason == "length" else "completed"
    usage = None
    if prompt_tokens is not None and completion_tokens is not None:
        usage = {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at or time.time(),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"],
        "output": [] if text is None else [_message(item_id, text, "incomplete" if status == "incomplete" else "completed")],
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [],
        "top_p": body.get("top_p"),
        "store": False,
        "text": body.get("text") or {"format": {"type": "text"}},
        "truncation": body.get("truncation") or "disabled",
        "metadata": body.get("metadata") or {},
        "usage": usage,
    }


class ResponsesStream(MappedStream):
    def __init__(self, body: dict[str, Any]):
        super().__init__(str(body["model"]))
        self.body = body
        self.response_id, self.item_id, self.created_at = new_id("resp_"), new_id("msg_"), time.time()
        self.sequence = 0
        self.parts: list[str] = []

    def _send(self, kind: str, **fields: Any) -> bytes:
        event = sse(kind, {"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return event

    def _place(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _response(self, text: str | None, prompt: int | None = None, completion: int | None = None) -> dict[str, Any]:
        reason = self.finish_reason
        return response_object(self.body, self.response_id, self.item_id, text, reason, prompt, completion, self.created_at)

    def start(self) -> bytes:
        return (
            self._send("response.created", response=self._response(None))
            + self._send("response.in_progress", response=self._response(None))
            + self._send("response.output_item.added", output_index=0, item=_message(self.item_id, None, "in_progress"))
            + self._send(
                "response.content_part.added",
                **self._place(),
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        )

    def text(self, piece: str) -> bytes:
        self.parts.append(piece)
        return self._send("response.output_text.delta", **self._place(), delta=piece, logprobs=[])

    def end(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        text = "".join(self.parts)
        done = self._response(text, prompt_tokens, completion_tokens)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return (
            self._send("response.output_text.done", **self._place(), text=text, logprobs=[])
            + self._send("response.content_part.done", **self._place(), part=part)
            + self._send("response.output_item.done", output_index=0, item=done["output"][0])
            + self._send("response.incomplete" if done["status"] == "incomplete" else "response.completed", response=done)
        )

    def error(self, error: dict[str, Any]) -> bytes:
        self._ended = True
        return self._send("error", code=error.get("code"), message=str(error.get("message")), param=error.get("param"))
