"""What the simulated llama-server makes of a completion request (SIMULATED): the pinned llama-server's parameter rules.

agents.orchestra.engines.llamacpp.twin serves it over HTTP; this module holds no HTTP. The rules were read off the pinned
build (llama-cpp-python 0.3.36's vendor/llama.cpp, tools/server/) by asking it, and tests/e2e/orchestra/test_llamacpp_twin.py
asks both again:
- a field of the wrong JSON type is a 400 ``Field 'x': [json.exception.type_error.302] type must be number, but is
  string`` (nlohmann's words); a null field counts as absent; a bool is a number; a float is truncated;
- ``n`` lies in 1..the slot count (--parallel); ``max_completion_tokens``, then ``max_tokens``, then ``n_predict``
  (the first present) in -1..2**31-1; -1 or absent: the model writes until its own end (64 to 512 tokens here; a
  limit above that ends there too, finish_reason "stop"); 0 still writes one token;
- ``stop``: a string or a list of strings (another type is ignored, a non-string in a list is a 400); the text
  ends before the first stop found, finish_reason "stop";
- ``seed``: the same seed and request give the same text; choice i of n draws with seed + i;
- chat's ``tools`` not an array, or a tool without ``function``, is a 500 "Failed to parse tools: ..."; a
  ``tool_choice`` other than auto/none/required or an object is a 400 "Invalid tool_choice: X"; a ``response_format``
  object of another type than text/json_object/json_schema is a 400; ``tool_choice`` "required" or a named function
  (with tools) and ``response_format`` json_object/json_schema constrain the answer: agents.orchestra.twins.structured;
- logprobs: completions' ``logprobs: N`` (true is 1) gives N alternatives per token; chat's ``logprobs: true`` gives
  ``top_logprobs`` of them (20 when absent; none when <= 0); ``top_logprobs`` without ``logprobs`` is a 400.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

from agents.orchestra.twins.state import WORDS
from agents.orchestra.twins.structured import ANY_OBJECT, Structured  # any object: llama-server's grammar allows any

INT_MAX = 2**31 - 1
CHAT_TOP_LOGPROBS = 20  # chat's logprobs: true without top_logprobs lists this many alternatives
VOCAB = sorted(set(WORDS))
OWN_END = (64, 512)  # where the simulated model writes its end token: an answer ends there unless its limit comes first


class LlamaRequestError(Exception):
    """A request llama-server refuses: its status, message and error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _json_type(value: object) -> str:
    """nlohmann::json's name for a value's type, as its type errors say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_error(name: str, want: str, value: object) -> LlamaRequestError:
    return LlamaRequestError(
        400, f"Field '{name}': [json.exception.type_error.302] type must be {want}, but is {_json_type(value)}"
    )


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise _type_error(name, "number", value)
    return float(value)


def _int_in(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = _number(body, name)
    if value is None:
        return None
    number = int(value)
    if not low <= number <= high:
        raise LlamaRequestError(400, f"Field '{name}': Value must be between {low} <= value <= {high}, but got {number}")
    return number


@dataclass(frozen=True)
class Token:
    """One generated token: its id in the simulated vocabulary, its text and its log-probability."""

    id: int
    piece: str
    logprob: float


@dataclass
class LlamaRequest:
    chat: bool
    prompt: str
    n_predict: int = -1
    n: int = 1
    stops: list[str] = field(default_factory=list)
    seed: int | None = None
    n_probs: int = 0
    stream: bool = False
    include_usage: bool = False
    structured: Structured | None = None  # the answer is a tool call or JSON of a schema (a grammar constrains it)

    def rng(self, index: int) -> random.Random:
        """Choice ``index``'s draws: fixed by the seed (and the prompt), else fresh each time."""
        if self.seed is None or self.seed < 0:
            return random.Random()
        return random.Random(hashlib.sha256(f"{self.seed + index}\0{self.prompt}".encode()).digest())

    def limit(self, rng: random.Random) -> tuple[int, str]:
        """How many tokens the choice writes and why it ends there: its limit ("length") or the model's own end
        ("stop"), as a real model ends its answer (a gateway's 32k figure is a ceiling, not a length)."""
        own = rng.randint(*OWN_END)
        if self.n_predict < 0 or own < max(1, self.n_predict):
            return own, "stop"
        return max(1, self.n_predict), "length"


def parse_request(body: object, chat: bool, slots: int) -> LlamaRequest:
    """The request's parameters, or the LlamaRequestError llama-server answers for them (checked in its order)."""
    if not isinstance(body, dict):
        raise LlamaRequestError(400, f"[json.exception.type_error.304] cannot use at() with {_json_type(body)}")
    if chat:
        if "messages" not in body:
            raise LlamaRequestError(400, "'messages' is required")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise LlamaRequestError(400, "Expected 'messages' to be an array")
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        if "prompt" not in body:
            raise LlamaRequestError(400, "[json.exception.out_of_range.403] key 'prompt' not found")
        raw = body["prompt"]
        if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            raw = raw[0]
        if not isinstance(raw, str):
            raise LlamaRequestError(
                400,
                '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                "or a list of mixed strings & tokens.",
            )
        prompt = raw
    request = LlamaRequest(chat=chat, prompt=prompt)
    request.n = _int_in(body, "n", 1, slots) or 1
    for name in ("max_completion_tokens", "max_tokens", "n_predict"):
        limit = _int_in(body, name, -1, INT_MAX)
        if limit is not None:
            request.n_predict = limit
            break
    seed = _number(body, "seed")
    request.seed = None if seed is None else int(seed)
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty"):
        _number(body, name)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _type_error("stream", "boolean", stream)
    request.stream = bool(stream)
    options = body.get("stream_options")
    request.include_usage = isinstance(options, dict) and options.get("include_usage") is True
    stop = body.get("stop")
    if isinstance(stop, str):
        request.stops = [stop] if stop else []
    elif isinstance(stop, list):
        for item in stop:
            if not isinstance(item, str):
                raise _type_error("stop", "string", item)
        request.stops = [s for s in stop if s]
    request.n_probs = _n_probs(body, chat)
    request.structured = _structured(body) if chat else None
    return request


def _structured(body: dict[str, Any]) -> Structured | None:
    """The constraint on the answer, or the error llama-server answers for tools, tool_choice or response_format."""
    tools, choice, fmt = body.get("tools"), body.get("tool_choice"), body.get("response_format")
    if tools is not None:
        if not isinstance(tools, list):
            shown = json.dumps(tools)
            raise LlamaRequestError(
                500, f"Failed to parse tools: Expected 'tools' to be an array, got {shown}; tools = {shown}", "server_error"
            )
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
                shown = json.dumps(tool)
                raise LlamaRequestError(500, f"Failed to parse tools: Missing tool function: {shown}", "server_error")
    if choice is not None and not isinstance(choice, dict) and choice not in ("auto", "none", "required"):
        raise LlamaRequestError(400, f"Invalid tool_choice: {choice}")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if isinstance(fmt, dict) and kind not in ("text", "json_object", "json_schema"):
        raise LlamaRequestError(400, f'response_format type must be one of "text" or "json_object", but got: {kind}')
    if tools and (choice == "required" or isinstance(choice, dict)):
        functions = [tool["function"] for tool in tools]
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        function = next((f for f in functions if f.get("name") == named), functions[0])
        parameters = function.get("parameters")
        return Structured(parameters if isinstance(parameters, dict) else {"type": "object"}, str(function.get("name")))
    if isinstance(fmt, dict) and kind == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else fmt.get("schema")
        return Structured(schema if isinstance(schema, dict) else {"type": "object"})
    if isinstance(fmt, dict) and kind == "json_object":
        return Structured(ANY_OBJECT)
    return None


def _n_probs(body: dict[str, Any], chat: bool) -> int:
    logprobs = _number(body, "logprobs")
    if not chat:
        return max(0, int(logprobs or 0))
    top = body.get("top_logprobs")
    if "top_logprobs" in body and not logprobs:
        raise LlamaRequestError(400, "top_logprobs requires logprobs to be set to true")
    if not logprobs:
        return 0
    if top is None or isinstance(top, str):
        return CHAT_TOP_LOGPROBS
    if not isinstance(top, (int, float)):
        return CHAT_TOP_LOGPROBS
    return max(0, int(top))


def draw(rng: random.Random) -> Token:
    index = rng.randrange(len(VOCAB))
    return Token(index, " " + VOCAB[index], -rng.uniform(0.5, 4.0))


def token_logprobs(token: Token, n_probs: int, rng: random.Random) -> dict[str, Any]:
    """llama-server's entry for one token: the token, its bytes and log-probability, and its n_probs best alternatives."""
    alternatives = []
    for rank in range(n_probs):
        index = rank % len(VOCAB) if rank < len(VOCAB) else len(VOCAB) + rank
        piece = " " + VOCAB[index] if index < len(VOCAB) else f" w{index}"
        alternatives.append({"id": index, "token": piece, "bytes": list(piece.encode()), "logprob": -0.1 - rank * 0.25})
    return {
        "id": token.id,
        "token": token.piece,
        "bytes": list(token.piece.encode()),
        "logprob": token.logprob,
        "top_logprobs": alternatives,
    }


class StopScan:
    """The text of one choice as it grows, cut before the first stop string; what may be sent holds back a partial stop."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.text = ""
        self.sent = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add a token's text; answer what can be sent now (never a stop string, nor the start of one)."""
        self.text += piece
        found = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True
            return self.flush()
        hold = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.text)), 0, -1):
                if self.text.endswith(stop[:size]):
                    hold = max(hold, size)
                    break
        out = self.text[self.sent : len(self.text) - hold]
        self.sent += len(out)
        return out

    def flush(self) -> str:
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out
