"""How much one request may generate, read in one place every route uses: the length fields of every engine the
gateway fronts (OpenAI's two names, llama-server's `n_predict`, TGI's `max_new_tokens`, vLLM's `min_tokens` and
`ignore_eos`) normalised into one figure per choice, and the number of choices (`n`, `best_of`) that multiplies it.
The figure always goes upstream under the names the engine reads (with_lengths) and every other length field is
removed, so no engine reads a length the gateway did not hold (an engine left without one generates to the end of its context); a request
that one engine would read differently from another is refused, never guessed at."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents.gateway.target import NotServable, Target
from agents.wire.words import plural

OPENAI_FIELDS = ("max_completion_tokens", "max_tokens")  # OpenAI's newer name first; what goes upstream
ENGINE_FIELDS = ("n_predict", "max_new_tokens")  # llama-server's (it overrides both of OpenAI's), TGI's
LENGTH_FIELDS = OPENAI_FIELDS + ENGINE_FIELDS
MAX_CHOICES = 128  # OpenAI's bound on n (and best_of); each choice is held at the full figure
TEMPLATE_TOKENS = 8  # a chat template's markers around one message (and around the whole), special tokens each


@dataclass(frozen=True)
class Lengths:
    """What a request asks to generate: `figure` tokens for each of `choices` choices."""

    figure: int  # per choice: the least of the length fields given, else the gateway's cap
    choices: int  # max(n, best_of): what the engine generates, whatever it returns
    asked: bool  # a length field was given (else the figure is the gateway's default)


def _whole(body: dict[str, Any], name: str, low: int, cap: int, rule: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise NotServable(400, f"{name} must be a whole number >= {low}", "invalid_max_tokens", param=name)
    if value > cap:
        raise NotServable(400, f"{name} is {str(value)[:24]}; {rule}", "invalid_max_tokens", param=name)
    return value


def read_lengths(body: dict[str, Any], cap: int) -> Lengths:
    """The request's lengths, or a 400 naming the first field the gateway would not hold as an engine reads it."""
    rule = f"this gateway answers at most {plural(cap, 'token')} a request (gateway.policies.max_tokens)"
    given = [v for name in LENGTH_FIELDS if (v := _whole(body, name, 1, cap, rule)) is not None]
    figure = min(given) if given else cap
    choices_rule = f"at most {MAX_CHOICES}"
    n = _whole(body, "n", 1, MAX_CHOICES, choices_rule) or 1
    best_of = _whole(body, "best_of", 1, MAX_CHOICES, choices_rule)
    if best_of is not None and best_of < n:
        raise NotServable(400, f"best_of ({best_of}) must be >= n ({n})", "invalid_parameter", param="best_of")
    min_tokens = _whole(body, "min_tokens", 0, cap, rule)
    if min_tokens is not None and min_tokens > figure:
        raise NotServable(
            400, f"min_tokens ({min_tokens}) is more than max_tokens ({figure})", "invalid_max_tokens", param="min_tokens"
        )
    if "ignore_eos" in body and not isinstance(body["ignore_eos"], bool):
        raise NotServable(400, "ignore_eos must be true or false", "invalid_parameter", param="ignore_eos")
    return Lengths(figure=figure, choices=max(n, best_of or 1), asked=bool(given))


def with_lengths(body: dict[str, Any], figure: int, target: Target) -> dict[str, Any]:
    """The body to send upstream: the figure under the OpenAI name(s) the client used (max_tokens when none); a local
    engine also gets it as max_tokens (llama-server reads no max_completion_tokens: without it, to the end of its
    context) and llama-server as its own n_predict; a provider gets only the client's names (OpenAI's newer models
    refuse max_tokens). Every other length field removed; min_tokens no more than the figure (a hold may lower it)."""
    names = [n for n in OPENAI_FIELDS if body.get(n) is not None] or ["max_tokens"]
    if target.tier == "local":
        names.append("max_tokens")
        if target.length_param is not None:
            names.append(target.length_param)
    sent = {k: v for k, v in body.items() if k not in LENGTH_FIELDS}
    sent.update(dict.fromkeys(names, figure))
    if isinstance(sent.get("min_tokens"), int):
        sent["min_tokens"] = min(sent["min_tokens"], figure)
    return sent


def _text_bytes(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))  # parts, tool calls: all of it


def _message_bytes(message: object) -> int:
    if not isinstance(message, dict):
        return _text_bytes(message)
    return sum(_text_bytes(value) for value in message.values())  # role, content, name, tool calls: all of it


def prompt_bound(body: dict[str, Any]) -> int:
    """An upper bound of the prompt's tokens: its bytes (every tokenizer the gateway fronts gives a token at least one
    byte), the chat template's markers and any tool definitions included."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = TEMPLATE_TOKENS + sum(TEMPLATE_TOKENS + _message_bytes(m) for m in messages)
    else:
        total = _text_bytes(body.get("prompt"))
    for extra in ("tools", "functions", "response_format", "suffix"):
        total += _text_bytes(body.get(extra))
    return max(1, total)
