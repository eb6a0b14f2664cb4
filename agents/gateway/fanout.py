"""The orchestra call of the gateway (POST /v1/orchestra/chat/completions): one prompt to several models at once, each
member metered and held like any request, every answer (or why there is none) back by the deadline."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from agents.gateway import proxy
from agents.gateway.exchange import Exchange
from agents.gateway.keys import ApiKey
from agents.gateway.lengths import read_lengths
from agents.gateway.limits import UpstreamTooLarge
from agents.gateway.metering import Record
from agents.gateway.openai_api import OrchestraBody, checked_body, error_response, max_wait
from agents.gateway.routes import ROUTES
from agents.gateway.target import NotServable, Target
from agents.wire.lab.gateway import MAX_GROUP_MEMBERS

if TYPE_CHECKING:
    from agents.gateway.server import GatewayHttp

MAX_FANOUT = MAX_GROUP_MEMBERS  # models in one orchestra call
CHAT = next(r for r in ROUTES if r.path == "/v1/chat/completions")  # every member is asked as chat is


def member_missed(
    model: str,
    status: str,
    error: str,
    http_status: int,
    latency_s: float,
    target: Target | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """An orchestra member that did not answer (error, timeout): the keys of one that did, null where there is no figure,
    so a client reads every result alike."""
    return {
        "model": model,
        "tier": target.tier if target else None,
        "target": target.where if target else None,
        "simulated": target.simulated if target else None,
        "status": status,
        "http_status": http_status,
        "latency_s": latency_s,
        "ttft_s": None,
        "usage": None,
        "cost": None,
        "cloud_equivalent": None,
        "fallback_reason": target.reason if target else None,
        "woke": bool(target and target.woke),
        "error": error,
        "param": param,  # the parameter a member's refusal names, as OpenAI's 400 does
    }


def _deadline(raw: object, default: float) -> float:
    """The orchestra call's deadline_s: a finite number of seconds > 0 (at most a day), or the default."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or not 0 < raw <= 86400:
        raise NotServable(
            400, f"deadline_s must be a number of seconds > 0 and <= 86400, got {str(raw)[:40]!r}", "invalid_deadline"
        )
    return float(raw)


class Fanout:
    """The orchestra call, on the gateway's HTTP server (its keys' holds, its sessions, its meter)."""

    def __init__(self, http: GatewayHttp) -> None:
        self.http = http

    async def answer(self, request: web.Request) -> web.Response:
        """POST /v1/orchestra/chat/completions: one prompt to several models at once, every answer by the deadline."""
        try:
            body = await self.http.body(request)
            members = self._members(body)
            for member in members:  # a key that may not use one member is refused the call, before any member runs
                self.http.check_may_use(request[proxy.API_KEY], member)
            deadline_s = max_wait(request)
            if deadline_s is None:
                deadline_s = _deadline(body.get("deadline_s"), self.http.gw.policies.queue_timeout_s)
            asked = {k: v for k, v in body.items() if k not in ("models", "group", "deadline_s", "stream")}
            read_lengths(asked, self.http.gw.policies.max_tokens)
            CHAT.check(asked)  # the chat route's checks, once for the call: every member would refuse the same
            self.http.holds.enter(request[proxy.API_KEY])
        except NotServable as exc:
            return error_response(exc.status, exc.message, exc.code, exc.retry_after_s, param=exc.param)
        payload = asked
        started = time.monotonic()
        tasks = {name: asyncio.create_task(self._one(request[proxy.API_KEY], name, payload, deadline_s)) for name in members}
        try:
            done, pending = await asyncio.wait(tasks.values(), timeout=deadline_s)
        finally:  # the client left (cancelled) or the deadline passed: no member keeps running upstream
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            self.http.holds.leave(request[proxy.API_KEY])
        results = []
        for name, task in tasks.items():
            if task in done and not task.cancelled() and task.exception() is None:
                results.append(task.result())
            else:
                results.append(member_missed(name, "timeout", f"no answer within the {deadline_s:g} s deadline", 504, deadline_s))
        answered = [r for r in results if r["status"] == "ok"]
        return web.json_response(
            {
                "object": "orchestra.chat.completion",
                "deadline_s": deadline_s,
                "latency_s": round(time.monotonic() - started, 6),
                "partial": len(answered) < len(results),
                "answered": len(answered),
                "asked": len(results),
                "cost": round(sum(r.get("cost") or 0.0 for r in answered), 8),
                "results": results,
            }
        )

    def _members(self, body: dict[str, Any]) -> list[str]:
        """The members, each checked as any route checks a model name (a lab group's are checked at load)."""
        if not isinstance(body.get("group"), str) and not isinstance(body.get("models"), list):
            raise NotServable(400, "give models: [names] or group: NAME", "invalid_models")
        if isinstance(body.get("models"), list) and len(body["models"]) > MAX_FANOUT:
            raise NotServable(400, f"at most {MAX_FANOUT} models in one orchestra call", "too_many_models")
        asked = checked_body(OrchestraBody, body)
        if asked.group is not None:
            group = self.http.gw.lab.orchestra.groups.get(asked.group)
            if group is None:
                raise NotServable(
                    404,
                    f"no orchestra group {asked.group!r} (orchestra.groups: {', '.join(self.http.gw.lab.orchestra.groups) or 'none'})",
                    "group_not_found",
                )
            return list(dict.fromkeys(group))
        if not asked.models:
            raise NotServable(400, "give models: [names] or group: NAME", "invalid_models")
        return list(dict.fromkeys(asked.models))

    async def _one(self, key: ApiKey, name: str, payload: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """One member of the fan-out: the exchange every request to a model takes (its checks, what the model serves
        and its engine can take, the hold, routing and waking, the retry, the meter), its answer or why there is none."""
        http = self.http
        record = Record(key=key.name, model=http.gw.router.canonical(name), tier="none", target=None, status=500, stream=False)
        x = Exchange(key, name, CHAT, {**payload, "model": name}, record, max_wait_s=deadline_s, timeout_s=deadline_s)

        async def send(target: Target, body: dict[str, Any], timeout_s: float) -> tuple[None, proxy.Outcome]:
            return None, await proxy.fetch(http.session_for(target), target, CHAT.upstream, body, timeout_s)

        try:
            lengths = http.admit(x, known=True)
            _, outcome = await http.carry(x, lengths, send)
            target = x.target
            assert target is not None
            http.finish(key, record, outcome, target, x.body)
            result = {
                "model": target.model,
                "tier": target.tier,
                "target": target.where,
                "simulated": target.simulated,
                "status": "ok" if outcome.status == 200 else "error",
                "http_status": outcome.status,
                "latency_s": round(time.monotonic() - x.started, 6),
                "ttft_s": outcome.ttft_s,
                "usage": {
                    "prompt_tokens": outcome.prompt_tokens,
                    "completion_tokens": outcome.completion_tokens,
                    "source": outcome.usage_source,
                },
                "cost": record.cost,
                "cloud_equivalent": record.cloud_equivalent,
                "fallback_reason": target.reason,
                "woke": target.woke,
            }
            if outcome.status == 200:
                result["choices"] = (outcome.data or {}).get("choices")
            else:
                result["error"] = json.dumps((outcome.data or {}).get("error"))[:500]
            return result
        except NotServable as exc:
            record.status, record.error = exc.status, exc.message
            return member_missed(
                record.model, "error", exc.message, exc.status, round(time.monotonic() - x.started, 6), x.target, exc.param
            )
        except (TimeoutError, aiohttp.ClientError, OSError, UpstreamTooLarge) as exc:
            record.status, record.error = 502, str(exc) or type(exc).__name__
            return member_missed(record.model, "error", record.error, 502, round(time.monotonic() - x.started, 6), x.target)
        except asyncio.CancelledError:  # past the deadline, or the client left: a provider bills what it was asked
            http.abandoned(x, 504, "orchestra deadline")
            raise
        finally:
            http.close(x)
