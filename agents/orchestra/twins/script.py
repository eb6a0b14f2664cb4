"""The vLLM simulator's constrained answers (SIMULATED): each choice's tool call or JSON, piece by piece, as vLLM
writes them under a grammar (guided decoding): message.tool_calls with a `chatcmpl-tool-` id, streamed as
delta.tool_calls (index, id, type and name first, then the arguments in pieces), finish_reason "tool_calls"; JSON
content ending where its JSON ends ("stop"); either cut by the request's limit ("length")."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.orchestra.twins.structured import Structured, instance, pieces

if TYPE_CHECKING:
    from agents.orchestra.twins.state import Sampling


@dataclass
class Script:
    structured: Structured
    texts: list[list[str]]  # each choice's pieces
    ids: list[str]
    limit: int

    @classmethod
    def of(cls, structured: Structured | None, sampling: Sampling) -> Script | None:
        if structured is None:
            return None
        rngs = [random.Random(None if sampling.seed is None else sampling.seed + i) for i in range(sampling.n)]
        texts = [pieces(instance(structured.schema, rng), rng) for rng in rngs]
        ids = [f"chatcmpl-tool-{rng.getrandbits(128):032x}" for rng in rngs]
        return cls(structured, texts, ids, sampling.tokens)

    @property
    def tokens(self) -> int:
        """How many tokens the longest choice writes: its whole JSON, or the limit."""
        return min(self.limit, max(len(text) for text in self.texts))

    def finish(self, index: int, written: int) -> str:
        if written < len(self.texts[index]):
            return "length"
        return "tool_calls" if self.structured.tool else "stop"

    def answer(self, index: int, written: int) -> dict[str, Any]:
        """A non-streamed choice's message and finish_reason."""
        text = "".join(self.texts[index][:written])
        finish = self.finish(index, written)
        if self.structured.tool is None:
            return {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
        call = {"id": self.ids[index], "type": "function", "function": {"name": self.structured.tool, "arguments": text}}
        return {"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "finish_reason": finish}

    def delta(self, index: int, written: int) -> dict[str, Any] | None:
        """The delta of a choice's ``written``-th token, or None past the end of its JSON (a shorter choice of n)."""
        text = self.texts[index]
        if written > len(text):
            return None
        piece = text[written - 1]
        if self.structured.tool is None:
            return {"content": piece}
        if written == 1:
            head = {"index": 0, "id": self.ids[index], "type": "function"}
            return {"tool_calls": [{**head, "function": {"name": self.structured.tool, "arguments": piece}}]}
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
