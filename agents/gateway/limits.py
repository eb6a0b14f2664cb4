"""The gateway's doors: a cap on its connections from its share of the agent's fds, a deadline for the first request,
and caps on what an upstream may send back (answer size, one SSE event), split incrementally."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agents.runtime.limits import ThrottledLog

log = logging.getLogger("cetlab.gateway")

FD_SHARE = 8  # the gateway's connections take at most 1/8 of the agent's fds (its upstream connections as many again)
MIN_CONNECTIONS, MAX_CONNECTIONS = 16, 4096
MAX_UPSTREAM_BODY_BYTES = 32 * 1024 * 1024  # one non-streamed answer; OpenAI's largest are a few MB
MAX_SSE_EVENT_BYTES = 1024 * 1024  # one event of a stream (a delta is a few hundred bytes)
_BUSY = b'{"error": {"message": "the gateway has all the connections it takes", "type": "server_error", "code": "busy"}}'
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


def connection_cap(configured: int | None, fd_limit: int | None = None) -> int:
    """`gateway.policies.max_connections`, else the gateway's share of the process's fd limit (``fd_limit``: its soft
    RLIMIT_NOFILE), so the SSH port and the tick always keep theirs; never more than MAX_CONNECTIONS, whatever
    `ulimit -n` says (a million fds is no reason for 131,072 connections)."""
    if configured is not None:
        return configured
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if fd_limit is None else fd_limit
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft // FD_SHARE))


class UpstreamTooLarge(Exception):
    """An upstream answer or event past its cap."""


async def read_capped(response: aiohttp.ClientResponse, max_bytes: int = MAX_UPSTREAM_BODY_BYTES) -> bytes:
    """The upstream's whole answer, at most `max_bytes` (UpstreamTooLarge past it, read no further)."""
    if response.content_length is not None and response.content_length > max_bytes:
        raise UpstreamTooLarge(f"the answer is {response.content_length} bytes, over the gateway's {max_bytes}")
    chunks: list[bytes] = []
    got = 0
    async for chunk in response.content.iter_any():
        got += len(chunk)
        if got > max_bytes:
            raise UpstreamTooLarge(f"the answer is over the gateway's {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class SseSplitter:
    """Server-sent events out of chunks as they come: each byte is searched for the blank line once (never the whole
    tail again per chunk), and an event past `max_event_bytes` raises UpstreamTooLarge."""

    def __init__(self, max_event_bytes: int = MAX_SSE_EVENT_BYTES):
        self.max_event_bytes = max_event_bytes
        self._tail = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._tail and len(chunk) > 1 and chunk.find(b"\n\n") == len(chunk) - 2:  # one whole event, as engines write it
            return [chunk[:-2]]
        start = max(0, len(self._tail) - 1)  # a "\n\n" may straddle the old tail and the new chunk
        self._tail += chunk
        events: list[bytes] = []
        begin = 0
        while True:
            end = self._tail.find(b"\n\n", start)
            if end < 0:
                break
            events.append(bytes(self._tail[begin:end]))
            begin = start = end + 2
        if begin:
            del self._tail[:begin]
        if len(self._tail) > self.max_event_bytes:
            raise UpstreamTooLarge(f"an event of the stream is over the gateway's {self.max_event_bytes} bytes")
        return events

    def rest(self) -> bytes:
        """What is left after the last blank line (an event the stream ended without closing)."""
        tail = bytes(self._tail)
        self._tail.clear()
        return tail


class ConnectionGate:
    """The gateway's protocol factory: at most `cap` connections at once, and a connection that has not sent a whole
    request head within `first_request_s` is closed (aiohttp's keep-alive timeout takes over after its first request).

    At the cap, the oldest connection that has still sent no request makes room (a client sends its request within a
    round trip of connecting, so only idle connections are ever the oldest such); when every connection is in a
    request, the new one gets a 503 and is closed at once, so the listening socket never backs up into accept errors."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], cap: int, first_request_s: float):
        self.factory, self.cap, self.first_request_s = factory, cap, first_request_s
        self.live: dict[asyncio.BaseTransport, asyncio.TimerHandle | None] = {}  # oldest first; None: a request came
        self.refused = self.evicted = 0

    def __call__(self) -> asyncio.Protocol:
        if len(self.live) >= self.cap and not self._evict_oldest_idle():
            self.refused += 1
            if (
                self.refused in (1, 10, 100, 1000) or self.refused % 10000 == 0
            ):  # throttled: a flood is one line, not one per connection
                log.warning("gateway: all %d connections are in requests; %d refused so far", len(self.live), self.refused)
            return _Refused()
        return _Gated(self, self.factory())

    def _evict_oldest_idle(self) -> bool:
        for transport, timer in self.live.items():
            if timer is not None:
                timer.cancel()
                del self.live[transport]  # connection_lost finds it gone
                transport.close()
                self.evicted += 1
                if self.evicted in (1, 1000) or self.evicted % 100000 == 0:
                    log.warning(
                        "gateway: %d connections open (the cap): %d closed before their first request to make room",
                        self.cap,
                        self.evicted,
                    )
                return True
        return False

    def request_seen(self, transport: asyncio.BaseTransport | None) -> None:
        """The middleware saw a request on this connection: its first-request deadline is off."""
        timer = self.live.get(transport) if transport is not None else None
        if timer is not None:
            timer.cancel()
            self.live[transport] = None  # type: ignore[index]


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(REFUSED)
        transport.close()


_MALFORMED = json.dumps({"error": {"message": "malformed HTTP request", "type": "invalid_request_error", "code": "bad_request"}})
_malformed_log = ThrottledLog(log)


class _QuietHandler(RequestHandler):
    """aiohttp answers (and logs) a malformed request with the parser's message, which quotes the bad line: a bearer
    key included. This handler's 400s say only that the request was malformed, in the log too."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None) -> Any:
        if status != 400:
            return super().handle_error(request, status, exc, message)
        _malformed_log(
            logging.WARNING,
            "malformed",
            "gateway: a malformed HTTP request from %s (%s)",
            request.remote,
            type(exc).__name__ if exc else "bad request",
        )
        if request.writer.output_size > 0:
            raise ConnectionError("response already sent")
        response = web.Response(status=400, text=_MALFORMED, content_type="application/json")
        response.force_close()
        return response


def quiet_factory(server: web.Server) -> Callable[[], asyncio.Protocol]:
    """aiohttp's protocol factory for `server`, with the quiet 400s (aiohttp's own where its internals differ)."""
    kwargs = getattr(server, "_kwargs", None)
    loop = getattr(server, "_loop", None)
    if not isinstance(kwargs, dict) or loop is None:
        return server
    return lambda: _QuietHandler(server, loop=loop, **kwargs)


class _Gated(asyncio.Protocol):
    """aiohttp's own protocol for one connection, counted by the gate and given a deadline for its first request."""

    def __init__(self, gate: ConnectionGate, inner: asyncio.Protocol):
        self.gate, self.inner = gate, inner
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        loop = asyncio.get_running_loop()
        self.gate.live[transport] = loop.call_later(self.gate.first_request_s, self._no_request)
        self.inner.connection_made(transport)

    def _no_request(self) -> None:
        if self.transport is not None and self.gate.live.get(self.transport) is not None:
            self.gate.live[self.transport] = None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            timer = self.gate.live.pop(self.transport, None)
            if timer is not None:
                timer.cancel()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
