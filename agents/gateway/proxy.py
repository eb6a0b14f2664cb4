"""Forwarding one request to its target: JSON or SSE passed through chunk by chunk, usage read on the way."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from agents.gateway.keys import ApiKey
from agents.gateway.lengths import prompt_bound
from agents.gateway.limits import UpstreamTooLarge, read_capped
from agents.gateway.openai_api import (
    StreamRewriter,
    client_wants_usage,
    rewrite_answer,
    rewrite_parsed,
    upstream_error,
    upstream_stream_body,
)
from agents.gateway.target import Target


@dataclass
class Outcome:
    """What came back, for the meter."""

    status: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str | None = None
    ttft_s: float | None = None
    error: str | None = None
    data: dict[str, Any] | None = None  # the parsed JSON answer (non-streaming)
    raw: bytes = b""  # ... as it came, passed on unchanged
    content_type: str = "application/json"
    events: int = 0  # token events of a stream seen so far


# What the gateway keeps on a request, under aiohttp's typed keys (a plain string key warns, NotAppKeyWarning)
API_KEY = web.RequestKey("api_key", ApiKey)  # the gateway key that authenticated the request
STREAM_OUTCOME = web.RequestKey("stream_outcome", Outcome)  # the outcome of a stream under way
# llama-server (cpp-httplib) and vLLM (uvicorn) close a connection left idle for 5 s: the gateway lets its own go
# sooner, so it never sends a request down one the engine has just closed (aiohttp keeps them 15 s: a 502)
ENGINE_KEEPALIVE_S = 4.0


def tier_headers(target: Target) -> dict[str, str]:
    headers = {"x-cetlab-tier": target.tier, "x-cetlab-model": target.model, "x-cetlab-target": target.where}
    if target.simulated:
        headers["x-cetlab-simulated"] = "true"
    if target.reason:
        headers["x-cetlab-fallback-reason"] = target.reason[:300].encode("ascii", "replace").decode()
    if target.woke:
        headers["x-cetlab-woke"] = "true"
    return headers


def upstream_headers(target: Target) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if target.provider is not None and target.provider.api_key_env:
        key = os.environ.get(target.provider.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
    return headers


def _usage(outcome: Outcome, usage: object) -> None:
    """An engine's usage: chat's and completions' (prompt and completion tokens), and a pooling answer's (prompt and
    total, or vLLM's rerank: total only), which generates nothing."""
    if isinstance(usage, dict):
        prompt, completion, total = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
        if not isinstance(prompt, int) and isinstance(total, int) and completion is None:
            prompt = total
        if completion is None and isinstance(prompt, int) and isinstance(total, int):
            completion = total - prompt
        if isinstance(prompt, int) and isinstance(completion, int):
            outcome.prompt_tokens, outcome.completion_tokens, outcome.usage_source = prompt, completion, "engine"


class EventRewriter(Protocol):
    """What turns an engine's SSE into the client's: StreamRewriter (OpenAI's own events), a MappedStream (another API's)."""

    usage: dict[str, Any] | None
    token_events: int

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


async def fetch(session: aiohttp.ClientSession, target: Target, path: str, body: dict[str, Any], timeout_s: float) -> Outcome:
    """A non-streaming call; the answer is parsed (the orchestra call and the JSON passthrough both use it)."""
    started = time.monotonic()
    payload = {**body, "model": target.upstream_model, "stream": False}
    async with session.post(
        f"{target.base_url}{path}", json=payload, headers=upstream_headers(target), timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as response:
        raw = await read_capped(response)
    outcome = Outcome(status=response.status, ttft_s=time.monotonic() - started, raw=raw, content_type=response.content_type)
    try:
        outcome.data = json.loads(raw)
    except ValueError:
        outcome.data = {"error": {"message": raw[:300].decode(errors="replace")}}
    if response.status == 200 and isinstance(outcome.data, dict):
        _usage(outcome, outcome.data.get("usage"))
        if isinstance(body.get("model"), str):
            outcome.raw = rewrite_parsed(raw, outcome.data, body["model"], chat=path.endswith("chat/completions"))
    else:
        outcome.raw, outcome.content_type = upstream_error(raw, response.status, target.where, body), "application/json"
        outcome.error = f"{target.where} answered {response.status}"
    return outcome


async def stream(
    request: web.Request,
    session: aiohttp.ClientSession,
    target: Target,
    path: str,
    body: dict[str, Any],
    timeout_s: float,
    rewriter: EventRewriter | None = None,
) -> tuple[web.StreamResponse, Outcome]:
    """SSE from the target to the client, each event written as it arrives (rewritten: agents.gateway.openai_api);
    usage asked for upstream on every stream and read from the last event, else counted.

    Over 80 lines: one loop over the upstream's events, whose every branch writes, meters or cuts that stream."""
    started = time.monotonic()
    client_model = str(body.get("model"))
    payload = {**upstream_stream_body(body), "model": target.upstream_model}
    async with session.post(
        f"{target.base_url}{path}",
        json=payload,
        headers=upstream_headers(target),
        timeout=aiohttp.ClientTimeout(total=timeout_s, sock_read=timeout_s),
    ) as upstream:
        if upstream.status != 200 or not upstream.content_type.startswith("text/event-stream"):
            raw = await read_capped(upstream)
            outcome = Outcome(
                status=upstream.status,
                ttft_s=time.monotonic() - started,
                error=None if upstream.status == 200 else f"{target.where} answered {upstream.status}",
            )
            if upstream.status == 200:
                try:
                    _usage(outcome, json.loads(raw).get("usage"))
                except (ValueError, AttributeError):
                    pass
                raw = rewrite_answer(raw, client_model, chat=path.endswith("chat/completions"))
                content_type = upstream.content_type
            else:
                raw, content_type = upstream_error(raw, upstream.status, target.where, body), "application/json"
            answer = web.Response(body=raw, status=upstream.status, content_type=content_type, headers=tier_headers(target))
            return answer, outcome
        response = web.StreamResponse(
            status=200, headers={**tier_headers(target), "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        outcome = Outcome(status=200)
        request[STREAM_OUTCOME] = outcome  # what was produced so far, for the meter if the client leaves mid-stream
        if rewriter is None:
            n = body.get("n", 1)
            rewriter = StreamRewriter(
                client_model,
                client_wants_usage(body),
                chat=path.endswith("chat/completions"),
                upstream_model=target.upstream_model,
                choices=n if isinstance(n, int) else 0,
            )
        async for chunk in upstream.content.iter_any():
            if outcome.ttft_s is None:
                outcome.ttft_s = time.monotonic() - started
            try:
                out = rewriter.feed(chunk)
            except UpstreamTooLarge as exc:  # the stream ends here, with an error event the client can read
                outcome.status, outcome.error = 502, f"{target.where}: {exc}"
                error = {"error": {"message": str(exc), "type": "server_error", "code": "upstream_too_large"}}
                await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
                break
            # counted before it is written: what the engine produced is metered, read or not
            _usage(outcome, rewriter.usage)
            outcome.events = rewriter.token_events
            try:
                if out:
                    await response.write(out)
            except ConnectionResetError:  # the client went away: stop reading (closing the upstream stops the engine's work)
                outcome.status, outcome.error = 499, "the client closed the stream"
                settle_counted(outcome, body)
                return response, outcome
        else:
            last = rewriter.flush()
            _usage(outcome, rewriter.usage)
            outcome.events = rewriter.token_events
            if last:
                await response.write(last)
        await response.write_eof()
    settle_counted(outcome, body)
    return response, outcome


def settle_counted(outcome: Outcome, body: dict[str, Any]) -> None:
    """No usage from the engine: one delta event per token, as vLLM and OpenAI send them, and the prompt at its bound."""
    if outcome.usage_source is None:
        outcome.prompt_tokens, outcome.completion_tokens, outcome.usage_source = (
            prompt_bound(body),
            outcome.events,
            "counted",
        )
