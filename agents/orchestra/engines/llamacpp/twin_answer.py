"""The simulated llama-server's answers: a request's choices as they are written, and the JSON llama-server gives them
(a message or a tool call, a streamed delta, usage, logprobs)."""

from __future__ import annotations

import random
from typing import Any

from agents.orchestra.engines.llamacpp.twin_request import LlamaRequest, StopScan, Token, draw, token_logprobs
from agents.orchestra.twins.structured import call_id, instance, pieces


class Choice:
    """One of a request's n choices as it is written: its tokens, its text cut at a stop, why it ended; a constrained
    answer (a tool call, JSON of a schema) is written piece by piece and ends where its JSON ends."""

    def __init__(self, request: LlamaRequest, index: int):
        self.index = index
        self.rng = request.rng(index)
        self.limit, self.end_reason = request.limit(self.rng)
        self.scan = StopScan(request.stops)
        self.tokens: list[Token] = []
        self.finish_reason: str | None = None
        self.structured = request.structured
        self.script: list[str] = []
        self.call_id = ""
        if self.structured is not None:  # the grammar, not the model's own end, ends it
            self.script = pieces(instance(self.structured.schema, self.rng), self.rng)
            self.call_id = call_id(self.rng)
            self.limit, self.end_reason = (request.n_predict, "length") if request.n_predict >= 0 else (2**31, "length")
            self.scan = StopScan([])

    def step(self) -> tuple[Token, str]:
        """Write one more token; answer it and the text that may be sent for it."""
        token = draw(self.rng)
        if self.structured is not None:
            token = Token(token.id, self.script[len(self.tokens)], token.logprob)
        self.tokens.append(token)
        piece = self.scan.feed(token.piece)
        if self.structured is not None and len(self.tokens) == len(self.script):
            self.finish_reason = "tool_calls" if self.structured.tool else "stop"
            piece += self.scan.flush()
        elif self.scan.stopped:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.limit:
            self.finish_reason = self.end_reason
            piece += self.scan.flush()
        return token, piece

    @property
    def text(self) -> str:
        return self.scan.text


def message_of(choice: Choice) -> dict[str, Any]:
    """A chat answer's message: its text, or (a tool call) empty content and the call, as llama-server writes one."""
    tool = choice.structured.tool if choice.structured is not None else None
    if tool is None:
        return {"role": "assistant", "content": choice.text}
    call = {"type": "function", "function": {"name": tool, "arguments": choice.text}, "id": choice.call_id}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def delta_of(choice: Choice, piece: str) -> dict[str, Any]:
    """A streamed token's delta: its text, or a piece of the call's arguments (the first piece with its id and name)."""
    tool = choice.structured.tool if choice.structured is not None else None
    if tool is None:
        return {"content": piece}
    if len(choice.tokens) == 1:
        call = {"index": 0, "id": choice.call_id, "type": "function", "function": {"name": tool, "arguments": piece}}
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def logprobs_of(request: LlamaRequest, rng: random.Random, tokens: list[Token]) -> dict[str, Any] | None:
    if not request.n_probs:
        return None
    return {"content": [token_logprobs(token, request.n_probs, rng) for token in tokens]}
