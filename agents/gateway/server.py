"""The gateway's HTTP side: OpenAI-compatible routes, keys on every call, the orchestra fan-out."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from agents.gateway import proxy
from agents.gateway.anthropic_api import anthropic_error
from agents.gateway.chat_params import engine_refusal
from agents.gateway.exchange import Exchange, R, Send
from agents.gateway.fanout import Fanout
from agents.gateway.keys import ApiKey, QuotaExceeded
from agents.gateway.lengths import Lengths, read_lengths, with_lengths
from agents.gateway.limits import ConnectionGate, UpstreamTooLarge, connection_cap, quiet_factory
from agents.gateway.metering import Record
from agents.gateway.openai_api import (
    RoutedBody,
    checked_body,
    error_response,
    is_model_name,
    max_wait,
)
from agents.gateway.replicas import conversation_key
from agents.gateway.reservation import Reservations
from agents.gateway.routes import ANTHROPIC_PATHS, ROUTES, Route
from agents.gateway.target import NotServable, Target
from agents.runtime.stopping import DRAIN_S
from agents.runtime.waits import within
from agents.wire.lab.gateway import find_provider_model
from agents.wire.lab.model import Model

if TYPE_CHECKING:
    from agents.gateway.component import GatewayComponent

log = logging.getLogger("cetlab.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]  # what an aiohttp middleware wraps

RETRY_LOOK_S = 5.0  # a retry asks the failed machine's agent for its models this long at most
RETIRED_KEPT = 16  # sessions set aside after a broken connection, kept open for the requests still on them
UNKNOWN_MODEL = "?"  # how the meter files a request for a name that is no model (the name itself is kept nowhere)


class GatewayHttp:
    """The aiohttp application of one gateway component."""

    def __init__(self, gateway: GatewayComponent):
        self.gw = gateway
        self.session: aiohttp.ClientSession | None = None
        self.tunnel_sessions: dict[str, aiohttp.ClientSession] = {}  # SSH forward's unix socket -> its session
        self.retired_sessions: list[aiohttp.ClientSession] = []  # set aside after a broken connection (forget_session)
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self.gate: ConnectionGate | None = None
        self.cap = connection_cap(gateway.policies.max_connections)  # the one cap: client connections and upstream ones
        self.listener: asyncio.Server | None = None
        self.holds = Reservations(gateway.keys, gateway.meter, gateway.policies)
        self.fanout = Fanout(self)

    async def start(self, host: str, port: int) -> None:
        limit = self.gw.policies.max_body_bytes
        app = web.Application(client_max_size=limit, middlewares=[self._errors, self._auth])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        for route in ROUTES:  # every model route takes the one handler's steps (agents.gateway.routes)
            app.router.add_post(route.path, functools.partial(self.answer, route=route))
        app.router.add_post("/v1/orchestra/chat/completions", self.fanout.answer)
        policies = self.gw.policies
        cap = self.cap
        # many streams at once to few engines: no per-host cap below the gateway's own; as many as its own connections
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=cap, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=proxy.ENGINE_KEEPALIVE_S
            ),
            auto_decompress=False,
        )
        # handler_cancellation: a client that leaves cancels its handler, which closes the upstream request (the engine stops)
        self.runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            keepalive_timeout=policies.idle_s,
            shutdown_timeout=DRAIN_S,
        )
        await self.runner.setup()
        assert self.runner.server is not None
        self.gate = ConnectionGate(quiet_factory(self.runner.server), cap, policies.first_request_s)
        self.listener = await asyncio.get_running_loop().create_server(self.gate, host, port, reuse_address=True)
        self.port = self.listener.sockets[0].getsockname()[1]
        log.info(
            "gateway: at most %d connections, first request within %g s, idle %g s",
            cap,
            policies.first_request_s,
            policies.idle_s,
        )

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()
        for session in [*self.tunnel_sessions.values(), *self.retired_sessions]:
            await session.close()

    def session_for(self, target: Target) -> aiohttp.ClientSession:
        """The HTTP session that reaches the target: through its SSH forward's socket for another machine's engine."""
        if target.unix_socket is None:
            assert self.session is not None
            return self.session
        session = self.tunnel_sessions.get(target.unix_socket)
        if session is None:
            session = self.tunnel_sessions[target.unix_socket] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(
                    path=target.unix_socket, limit=self.cap, limit_per_host=0, keepalive_timeout=proxy.ENGINE_KEEPALIVE_S
                ),
                auto_decompress=False,
            )
        return session

    async def forget_session(self, target: Target) -> None:
        """The next request to the target's socket opens a fresh connection: its session is set aside, not closed (other
        requests may be streaming on it), and closed with the gateway or once RETIRED_KEPT newer ones were set aside."""
        if target.unix_socket is not None:
            session = self.tunnel_sessions.pop(target.unix_socket, None)
            if session is not None:
                self.retired_sessions.append(session)
            while len(self.retired_sessions) > RETIRED_KEPT:
                await self.retired_sessions.pop(0).close()

    # -- errors: OpenAI's JSON body for every status, aiohttp's own (404, 405, 413) included

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._openai_errors(request, handler)
        if request.path in ANTHROPIC_PATHS and response.status >= 400 and isinstance(response, web.Response):
            # Anthropic's clients read Anthropic's error shape: every error of its route rewritten here, whatever raised it
            assert isinstance(response.body, bytes)
            response.body = anthropic_error(response.status, response.body)
        return response

    async def _openai_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status == 404:
                message, code = (
                    f"no route {request.method} {request.path} (the gateway serves /v1/models, {', '.join(r.path for r in ROUTES)})",
                    "not_found",
                )
            elif exc.status == 405:
                message, code = f"{request.method} is not allowed on {request.path}", "method_not_allowed"
            elif exc.status == 413:
                message, code = (
                    f"the body is larger than gateway.policies.max_body_bytes ({self.gw.policies.max_body_bytes})",
                    "request_too_large",
                )
            else:
                message, code = exc.reason, None
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return error_response(exc.status, message, code, headers=allow)

    # -- auth

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.gate is not None:
            self.gate.request_seen(request.transport)
        if request.path == "/health":
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        # Anthropic's clients send the key as x-api-key: one key, either header
        token = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        key = self.gw.keys.lookup(token) if token else None
        if key is None:
            return error_response(
                401,
                "a valid gateway key is required: Authorization: Bearer <key> or x-api-key: <key> "
                "(`cetlab gateway keys add NAME`)",
                "invalid_api_key",
            )
        if self.gw.keys.expired(key):
            expires = self.gw.keys.limits(key).expires
            return error_response(
                401, f"gateway key {key.name} expired at {expires}; ask an operator for a new one", "invalid_api_key"
            )
        try:
            self.gw.keys.admit(key)
        except QuotaExceeded as exc:
            return error_response(429, str(exc), "quota_exceeded", exc.retry_after_s)
        request[proxy.API_KEY] = key
        return await handler(request)

    # -- routes

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _models(self, request: web.Request) -> web.Response:
        key = request[proxy.API_KEY]
        listed = [e for e in self.gw.catalogue() if self.may_use(key, e["id"])]  # a key sees the models it may use
        return web.json_response({"object": "list", "data": listed})

    def may_use(self, key: ApiKey, model: str) -> bool:
        """Whether the key's models (names and aliases, fnmatch patterns) include this one, by any of its names."""
        limits = self.gw.keys.limits(key)
        if not limits.models:
            return True
        router = self.gw.router
        canonical = router.canonical(model)
        names = {model, canonical, *(alias for alias, name in router.aliases.items() if name == canonical)}
        found = find_provider_model(self.gw.lab.providers, canonical)
        if found is not None:  # a provider's model answers to its name and to provider/name alike
            names |= {found[1].name, f"{found[0].name}/{found[1].name}"}
        return limits.allows(names)

    def check_may_use(self, key: ApiKey, model: str) -> None:
        """OpenAI's answer to a model the caller has no access to: 404 model_not_found naming `model`."""
        if not self.may_use(key, model):
            raise NotServable(
                404,
                f"The model '{model}' does not exist or gateway key {key.name} may not use it "
                f"(its models: {', '.join(self.gw.keys.limits(key).models)})",
                "model_not_found",
                param="model",
            )

    def check_serves(self, model: str, route: Route) -> None:
        """A model answers the routes of what it serves (lab.yaml's model.serves); a provider's model, its own API's."""
        serves = self.gw.router.serves(model)
        if serves is not None and serves != route.serves:
            where = next(r.path for r in ROUTES if r.serves == serves)
            raise NotServable(
                400,
                f"The model '{model}' serves {serves} ({where}), not {route.path}",
                "model_not_supported",
                param="model",
            )

    async def _model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{id}: one model (an alias answers as itself), or OpenAI's 404."""
        name = request.match_info["model"]
        if not is_model_name(name):  # never echoed: markup, control characters, 8 KiB of anything
            return error_response(
                404,
                "no model of that name (letters, digits and ._:/@+-, at most 256; GET /v1/models lists them)",
                "model_not_found",
                param="model",
            )
        canonical = self.gw.router.canonical(name)
        try:
            self.check_may_use(request[proxy.API_KEY], name)
        except NotServable as exc:
            return error_response(exc.status, exc.message, exc.code, param=exc.param)
        for entry in self.gw.catalogue():
            if entry["id"] in (name, canonical) or (entry.get("provider") and f"{entry['provider']}/{entry['id']}" == name):
                return web.json_response({**entry, "id": name})
        return error_response(
            404, f"The model '{name}' does not exist (GET /v1/models lists them)", "model_not_found", param="model"
        )

    async def body(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await within(request.read(), self.gw.policies.body_timeout_s)
        except TimeoutError:
            raise NotServable(
                408, f"the body did not arrive within {self.gw.policies.body_timeout_s:g} s", "body_timeout"
            ) from None
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise NotServable(400, "the body is not JSON", "invalid_json") from None
        except RecursionError:
            raise NotServable(400, "the body is JSON nested too deeply", "invalid_json") from None
        if not isinstance(body, dict):
            raise NotServable(400, "the body must be a JSON object", "invalid_json")
        return body

    def _model_name(self, body: dict[str, Any]) -> tuple[str, bool]:
        """The asked model's name, checked for form before anything keeps it; and whether it names a known model."""
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise NotServable(400, "model is required (GET /v1/models lists them)", "invalid_model", param="model")
        model = checked_body(RoutedBody, body).model
        name = self.gw.router.canonical(model)
        router = self.gw.router
        return model, (
            name in router.local or name in router.served() or find_provider_model(self.gw.lab.providers, name) is not None
        )

    async def answer(self, request: web.Request, route: Route) -> web.StreamResponse:
        """Any model route: the body read and its model named, then the one exchange (GatewayHttp.carry) every request
        to a model takes, a member of the orchestra call's too; a stream is written to the client as it comes."""
        key = request[proxy.API_KEY]
        x = Exchange(
            key,
            UNKNOWN_MODEL,
            route,
            {},
            Record(key=key.name, model=UNKNOWN_MODEL, tier="none", target=None, status=500, stream=False),
        )
        x.begun = lambda: proxy.STREAM_OUTCOME in request
        entered = False
        try:
            client_body = await self.body(request)
            x.model, known = self._model_name(client_body)
            self.check_may_use(key, x.model)
            x.body = route.mapping.request(client_body) if route.mapping is not None else client_body
            x.max_wait_s = max_wait(request)
            lengths = self.admit(x, known)
            self.holds.enter(key)
            entered = True

            async def send(
                target: Target, body: dict[str, Any], timeout_s: float
            ) -> tuple[web.StreamResponse | None, proxy.Outcome]:
                if x.record.stream:  # written to the client as it comes, its headers first
                    rewriter = route.mapping.stream(client_body) if route.mapping is not None else None
                    return await proxy.stream(
                        request, self.session_for(target), target, route.upstream, body, timeout_s, rewriter
                    )
                return None, await proxy.fetch(self.session_for(target), target, route.upstream, body, timeout_s)

            streamed, outcome = await self.carry(x, lengths, send)
            target = x.target
            assert target is not None
            response = streamed
            if response is None:  # built once the request is done: its headers say what it took (a wake, a fallback)
                if route.mapping is not None and outcome.status == 200 and isinstance(outcome.data, dict):
                    outcome.raw = json.dumps(route.mapping.answer(outcome.data, client_body)).encode()
                response = web.Response(
                    body=outcome.raw, status=outcome.status, content_type=outcome.content_type, headers=proxy.tier_headers(target)
                )
            self.finish(key, x.record, outcome, target, x.body, route)
            return response
        except NotServable as exc:
            x.record.status, x.record.error = exc.status, exc.message
            return error_response(exc.status, exc.message, exc.code, exc.retry_after_s, param=exc.param)
        except UpstreamTooLarge as exc:
            x.record.status, x.record.error = 502, f"{x.record.target}: {exc}"
            return error_response(502, f"{x.record.model} on {x.record.target}: {exc}", "upstream_too_large")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            x.record.status, x.record.error = 502, f"{x.record.target}: {exc or type(exc).__name__}"
            return error_response(502, f"{x.record.model} on {x.record.target}: {exc or type(exc).__name__}", "upstream_failed")
        except asyncio.CancelledError:  # the client left: the upstream request is closed; what it produced is still charged
            self.abandoned(
                x,
                499,
                "the client closed the stream" if x.record.stream else "the client left before the answer came",
                request.get(proxy.STREAM_OUTCOME),
            )
            raise
        finally:
            self.close(x)
            if entered:
                self.holds.leave(key)

    def admit(self, x: Exchange, known: bool) -> Lengths:
        """The checks every request to a model passes before anything is held for it: the gateway's length cap and
        OpenAI's ranges, the route's body checks, what the model serves, what its engine can take; and its figures'
        in-flight count (an unknown name gets no figures of its own, and its 404 from the router)."""
        route, body = x.route, x.body
        lengths = read_lengths(body, self.gw.policies.max_tokens) if route.generates else Lengths(0, 1, False)
        route.check(body)
        self.check_serves(x.model, route)
        x.record.stream = body.get("stream") is True
        if known:
            x.record.model = self.gw.router.canonical(x.model)
            x.stats = self.gw.meter.stats(x.record.model)
            x.stats.in_flight += 1
        lab_model = self.gw.router.local.get(self.gw.router.canonical(x.model))
        if route.chat and lab_model is not None:  # before a model is brought up for a request its engine would refuse
            self.refuse_unsupported(body, lab_model)
        return lengths

    async def carry(self, x: Exchange, lengths: Lengths, send: Send[R]) -> tuple[R, proxy.Outcome]:
        """The hold, routing and waking, the request upstream through ``send`` while the model stays awake, and once
        more where nothing reached the client yet: on a broken connection (to another replica where one serves) or
        a 503 from an engine that went to sleep since its agent's last tick."""
        key, route, body = x.key, x.route, x.body
        prompt_tokens = route.prompt(body)
        x.hold = hold = self.holds.reserve_tokens(key, prompt_tokens, lengths)
        lab_model = self.gw.router.local.get(self.gw.router.canonical(x.model))
        conversation = conversation_key(body) if lab_model is not None and lab_model.replicas else None
        avoid: frozenset[str] = frozenset()  # a retry's: the machine that failed it, where another replica serves
        for attempt in range(2):
            x.target = target = await self.gw.router.route(x.model, x.max_wait_s, conversation, avoid)
            record = x.record
            record.model, record.tier, record.target, record.woke = target.model, target.tier, target.where, target.woke
            if route.chat and target.engine_model is not None and target.engine_model is not lab_model:
                self.refuse_unsupported(body, target.engine_model)  # a checkpoint's or an adapter's engine
            if not attempt:
                self.holds.reserve_money(hold, target, prompt_tokens)
            upstream_body = with_lengths(body, hold.figure, target) if route.generates else body
            timeout_s = x.timeout_s
            if timeout_s is None:
                timeout_s = target.provider.timeout_s if target.provider else self.gw.policies.queue_timeout_s * 10
            try:
                answered, outcome = await self.gw.router.while_awake(target, send(target, upstream_body, timeout_s))
            except aiohttp.ClientConnectionError as exc:
                if attempt or target.tier != "local" or x.begun():
                    raise  # a second failure, a provider's, or the client has bytes of this answer already
                # nothing reached the client yet: the connection to the engine broke (its agent restarted and its
                # forward was made anew, or a replica just went out); look again, and send it once more on a fresh
                # connection, to another replica where one serves
                log.info("%s on %s: %s before the answer began; trying again", target.model, target.where, exc)
                await self.forget_session(target)
                try:  # a fresh look at that machine, but never a wait for it: route() judges its link
                    async with asyncio.timeout(RETRY_LOOK_S):
                        await self.gw.router.refresh(target.where)
                except (TimeoutError, NotServable):
                    pass
                avoid = frozenset({target.where})
                continue
            if outcome.status != 503 or target.tier != "local" or attempt:
                return answered, outcome
            # the engine went to sleep (or is going) since its agent's last tick: look again, wake it, once
            await self.gw.router.refresh(target.where)
            avoid = frozenset({target.where})
        raise AssertionError("unreachable: the second attempt returns or raises")  # pragma: no cover

    def close(self, x: Exchange) -> None:
        """The exchange's end, however it ended: its hold released, its figures' in-flight count down, metered."""
        if x.stats is not None:
            x.stats.in_flight -= 1
            x.stats = None
        if x.hold is not None:
            self.holds.release(x.hold)
            x.hold = None
        x.record.latency_s = round(time.monotonic() - x.started, 6)
        self.gw.meter.record(x.record)

    def refuse_unsupported(self, body: dict[str, Any], model: Model) -> None:
        """A 400 naming the param when the engine that serves ``model`` cannot take one of this chat body's."""
        refused = engine_refusal(body, model, self.gw.router.engine_spec(model.engine))
        if refused is not None:
            raise NotServable(400, refused[0], "unsupported_parameter", param=refused[1])

    def abandoned(self, x: Exchange, status: int, error: str, streamed: proxy.Outcome | None = None) -> None:
        """Meter an exchange that ended before its answer (the client left, the orchestra call's deadline passed): a
        stream at the tokens it produced so far; an answer not yet come at its worst case where a provider bills it (a
        local engine stops when its connection closes: its prompt only). Nothing was held yet: nothing to meter."""
        target, hold = x.target, x.hold
        if target is None or hold is None:
            x.record.status, x.record.error = status, error
            return
        outcome = streamed
        if outcome is None:
            outcome = proxy.Outcome(status=status, prompt_tokens=x.route.prompt(x.body), usage_source="reserved")
            outcome.completion_tokens = hold.choices * hold.figure if target.tier == "provider" else 0
        elif outcome.usage_source is None:
            proxy.settle_counted(outcome, x.body)
        outcome.status, outcome.error = status, error
        self.finish(x.key, x.record, outcome, target, x.body, x.route)

    def finish(
        self, key: ApiKey, record: Record, outcome: proxy.Outcome, target: Target, body: dict[str, Any], route: Route = ROUTES[0]
    ) -> None:
        record.status, record.error, record.ttft_s = outcome.status, outcome.error, outcome.ttft_s
        if outcome.status == 200 and outcome.usage_source is None:
            outcome.prompt_tokens, outcome.usage_source = route.prompt(body), "counted"
        record.prompt_tokens, record.completion_tokens, record.usage_source = (
            outcome.prompt_tokens,
            outcome.completion_tokens,
            outcome.usage_source,
        )
        record.cost, record.cloud_equivalent = self.gw.price(target, outcome.prompt_tokens or 0, outcome.completion_tokens or 0)
        self.gw.keys.charge(key, (outcome.prompt_tokens or 0) + (outcome.completion_tokens or 0))
        self.gw.keys.spend(key, record.cost or 0.0)
