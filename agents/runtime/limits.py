"""Caps on what one connection and one principal may cost an agent: login slots, request budgets, channels, forwards,
reply sizes (the figures live here; agents/runtime/principals.py counts them per principal)."""

from __future__ import annotations

import json
import logging
import resource
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from agents.wire.protocol import MAX_REPLY_BYTES, ErrorCode, encode

log = logging.getLogger("cetlab.limits")

LOGIN_TIMEOUT_S = 10.0  # a connection that has not logged in by then is closed (asyncssh's default: 120 s)
MAX_PENDING_LOGINS_PER_ADDRESS = 32  # connections not logged in yet, per source address (16 consoles at once from one host) ...
MAX_PENDING_LOGINS = 128  # ... and in all; beyond either, one has to go (Doorman says which)
KEX_GRACE_S = 2.0  # a client in its key exchange has this long to offer a known key before it may be closed for room
MAX_CHANNELS_PER_CONNECTION = 4  # a console needs one
BUDGET_PER_S = 200.0  # request cost per second per connection, sustained (a ping costs 1) ...
BUDGET_BURST = 400  # ... and in a burst; beyond that: RATE_LIMITED, not executed ...
OVER_BUDGET_PAUSE_S = 0.25  # ... and that console's channel is not read for this long
BYTES_PER_COST = 4096  # a request line also costs one ping per 4 KiB: a 750 KB line costs ~180, before it is parsed
# One principal (an SSH key by fingerprint, or a uid on the unix socket) holds at most this, whatever carries it:
MAX_CONNECTIONS_PER_KEY = 32  # logged-in connections (a console holds one per agent; scripts a few more)
MAX_CHANNELS_PER_PRINCIPAL = 64  # channels, its connections' together
MIN_FORWARDS, MAX_FORWARDS = 16, 1024  # forwards (the gateway's key): a share of the agent's fds, see forward_cap
FORWARD_FD_SHARE = 4  # forwards take at most 1/4 of the agent's fds (each holds one, to its engine)
KEY_BUDGET_PER_S, KEY_BUDGET_BURST = 1000.0, 2000  # calls, all of its connections together, beside each one's own budget
MAX_UNREAD_BYTES_PER_PRINCIPAL = 32 * 1024 * 1024  # replies its channels have not taken, together: past it, one closes
PAUSE_READING_BYTES = 256 * 1024  # replies not yet taken by the console: stop reading its requests ...
MAX_UNSENT_BYTES = 16 * 1024 * 1024  # ... and past this (events keep coming), close its channel

# Methods whose answer grows with a param: (param, default, largest its params check allows, units per cost unit).
# history with max_points 3600 costs 101 pings; everything else costs 1.
_SIZED_COSTS: dict[str, tuple[str, int, int, int]] = {
    "history": ("max_points", 3600, 3600, 36),
    "jobs.logs": ("tail_lines", 100, 10000, 100),
    "audit.list": ("limit", 200, 5000, 50),
    "alerts.list": ("limit", 100, 1000, 50),
}


def request_cost(method: Any, params: Any) -> float:
    """What one request costs the agent, in pings."""
    sized = _SIZED_COSTS.get(method) if isinstance(method, str) else None
    if sized is None:
        return 1.0
    key, default, largest, per_unit = sized
    size = params.get(key, default) if isinstance(params, dict) else default
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        size = default
    if size > largest:  # the params check refuses it, for the price of a ping: never a debt that outlasts the burst
        return 1.0
    return 1.0 + size / per_unit


class TokenBucket:
    """A budget that refills at `rate_per_s` up to `burst`; a request spends its cost or is refused."""

    def __init__(self, rate_per_s: float = BUDGET_PER_S, burst: int = BUDGET_BURST):
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self, cost: float = 1.0) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens < min(cost, self.burst):  # a request dearer than the burst waits for a full bucket
            return False
        self.tokens -= cost
        return True


def forward_cap(fd_limit: int | None = None) -> int:
    """How many forwards one principal may hold open: a share of the process's fd limit (``fd_limit``: its soft
    RLIMIT_NOFILE), so its forwards can never take the fds the SSH port, the socket and the tick need (1,010 forwards
    filled a 1,024-fd agent: no login got through)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if fd_limit is None else fd_limit
    if soft == resource.RLIM_INFINITY:
        return MAX_FORWARDS
    return max(MIN_FORWARDS, min(MAX_FORWARDS, soft // FORWARD_FD_SHARE))


class KeyBudget:
    """A connection's budget and its key's, spent together: a request goes only if both have room."""

    def __init__(self, connection: TokenBucket, key: TokenBucket):
        self.connection, self.key = connection, key

    def take(self, cost: float = 1.0) -> bool:
        if not self.key.take(cost):
            return False
        if not self.connection.take(cost):
            self.key.tokens += cost  # not spent after all
            return False
        return True


class ThrottledLog:
    """At most one line per `every_s` per key; the lines held back are counted in the next one."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0):
        self.logger, self.every_s = logger, every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, level: int, key: str, message: str, *args: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -self.every_s) < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            message += f" (and {held} more like it in the last {self.every_s:.0f} s)"
        self.logger.log(level, message, *args, **kwargs)


class RepeatFilter(logging.Filter):
    """Lets a logger's record of one message through at most once per `every_s`; the ones held back are counted in
    the next (asyncio's "socket.send() raised exception." comes once per write to a peer that left: thousands)."""

    def __init__(self, every_s: float = 10.0):
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        if now - self._last.get(key, -self.every_s) < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        if len(self._last) > 1000:  # bounded: old keys go
            self._last.clear()
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {self.every_s:.0f} s)"
        return True


class Stage(IntEnum):
    """How far a connection that has not logged in yet has come; the login door lets the lowest go first."""

    SILENT = 0  # nothing sent: an idle TCP connection
    VERSION = 1  # its SSH version line only (a real client sends its KEXINIT as soon as it has read ours)
    KEX = 2  # bytes past the version line: its key exchange has begun
    AUTH = 3  # key exchange done, asking to authenticate
    KNOWN = 4  # offered a key this agent knows: a real console, moments from logging in; closed for room last


class Doorman:
    """Counts connections that have not logged in yet; at an address's or the total cap, one has to go.

    Which one: the oldest that has not begun a key exchange (silent, or its version line only: a storm needs no key
    for that); else the oldest in its key exchange or authentication without a known key that has had `kex_grace_s`;
    else the oldest that offered a known key and has not signed with it within that grace (a public key is no
    secret); when every waiting connection is in its first moments of a handshake, the newest is refused instead. A real console sends its KEXINIT within a
    round trip of its version line and offers its key a few more later, so a storm of connections that send a version
    line and nothing more, at any rate, never pushes it out (protecting every version line for 2 s did: 16 of 23 logins
    failed at 50 connections/s from the console's address).
    """

    def __init__(
        self, per_address: int = MAX_PENDING_LOGINS_PER_ADDRESS, total: int = MAX_PENDING_LOGINS, kex_grace_s: float = KEX_GRACE_S
    ):
        self.per_address, self.total, self.kex_grace_s = per_address, total, kex_grace_s
        self._pending: OrderedDict[Any, _Waiting] = OrderedDict()
        self.evicted: Counter[Stage] = Counter()  # closed for room, by how far they had come (bench, tests)
        self.refused = 0  # newcomers turned away: every waiting connection was further along
        self._log = ThrottledLog(log)

    def arrive(self, conn: Any, address: str, close: Callable[[], None], stage: Callable[[], Stage] = lambda: Stage.KEX) -> bool:
        """A new connection from `address`; `close` drops it, `stage()` says how far its bytes have come (the door
        adds AUTH and KNOWN). False: it was refused (and closed) to keep those already waiting."""
        same = [c for c, w in self._pending.items() if w.address == address]
        if len(same) >= self.per_address:
            full, why = same, f"{self.per_address} connections from {address} have not logged in yet"
        elif len(self._pending) >= self.total:
            full, why = list(self._pending), f"{self.total} connections have not logged in yet"
        else:
            full, why = [], ""
        if full:
            victim = self._victim(full)
            if victim is None:
                self.refused += 1
                self._log(logging.WARNING, "refuse", "refused a connection from %s: %s, all in their handshake", address, why)
                close()
                return False
            self._evict(victim, why)
        self._pending[conn] = _Waiting(address, close, stage, time.monotonic())
        return True

    def _victim(self, candidates: list[Any]) -> Any | None:
        """The oldest that has not begun a key exchange, else the oldest past its grace without a known key."""
        now = time.monotonic()
        late: dict[bool, Any] = {}  # the oldest past its grace, without and with a known key
        for conn in candidates:  # oldest first; a stage is read (a peek at its socket) only as far as needed
            waiting = self._pending[conn]
            stage = waiting.stage_now()
            if stage <= Stage.VERSION:
                return conn
            if now - waiting.arrived > self.kex_grace_s:
                late.setdefault(stage == Stage.KNOWN, conn)
        return late.get(False, late.get(True))

    def authenticating(self, conn: Any) -> None:
        """The connection finished its key exchange and asks to authenticate."""
        waiting = self._pending.get(conn)
        if waiting is not None:
            waiting.reached = max(waiting.reached, Stage.AUTH)

    def known_key(self, conn: Any) -> None:
        """The connection offered a key this agent knows: a real console."""
        waiting = self._pending.get(conn)
        if waiting is not None:
            waiting.reached = Stage.KNOWN

    def leave(self, conn: Any) -> None:
        """The connection logged in, or closed."""
        self._pending.pop(conn, None)

    def pending(self) -> int:
        return len(self._pending)

    def _evict(self, conn: Any, why: str) -> None:
        waiting = self._pending.pop(conn)
        stage = waiting.stage_now()
        self.evicted[stage] += 1
        self._log(
            logging.WARNING,
            "evict",
            "closed a connection from %s that had not logged in (%s): %s",
            waiting.address,
            stage.name.lower(),
            why,
        )
        waiting.close()


@dataclass
class _Waiting:
    address: str
    close: Callable[[], None]
    stage: Callable[[], Stage]
    arrived: float
    reached: Stage = Stage.SILENT  # what the SSH server has told the door (AUTH, KNOWN)

    def stage_now(self) -> Stage:
        return self.reached if self.reached >= Stage.AUTH else max(self.reached, self.stage())


def _item_sizes(items: list[Any]) -> list[int]:
    return [len(json.dumps(item, separators=(",", ":"), allow_nan=False, default=str)) + 1 for item in items]


def reply_line(response: dict[str, Any], limit: int = MAX_REPLY_BYTES) -> bytes:
    """The response as one JSON line of at most `limit` bytes; never raises.

    An answer too large has its longest list cut and says so (`truncated`, `omitted`): a log's
    `lines` keep their newest end, any other list its first items (the caller pages on from the
    last one). An answer that cannot be encoded (a NaN that got through) becomes `internal`.
    """
    request_id = response.get("id")
    try:
        line = encode(response)
    except (ValueError, TypeError, RecursionError):
        log.exception("reply to request %r could not be encoded", request_id)
        return encode(
            {
                "id": request_id,
                "error": {
                    "code": ErrorCode.INTERNAL.value,
                    "message": "internal error: the answer could not be encoded; see the agent's log",
                },
            }
        )
    if len(line) <= limit:
        return line
    answer = response.get("result")
    result: dict[str, Any] = answer if isinstance(answer, dict) else {}
    lists = {k: v for k, v in result.items() if isinstance(v, list) and v}
    if lists:
        key = max(lists, key=lambda k: len(lists[k]))
        items = lists[key]
        sizes = _item_sizes(items)
        room = limit - (len(line) - sum(sizes)) - 200  # the rest of the answer, and the marks we add
        newest_last = key == "lines"
        keep, used = 0, 0
        for size in reversed(sizes) if newest_last else sizes:
            if used + size > room:
                break
            used, keep = used + size, keep + 1
        kept = (items[len(items) - keep :] if keep else []) if newest_last else items[:keep]
        cut = {**response, "result": {**result, key: kept, "truncated": True, "omitted": len(items) - keep}}
        line = encode(cut)
        if len(line) <= limit:
            log.warning("reply to request %r cut to %d of %d %s (limit %d bytes)", request_id, keep, len(items), key, limit)
            return line
    return encode(
        {
            "id": request_id,
            "error": {
                "code": ErrorCode.TOO_LARGE.value,
                "message": f"the answer is larger than {limit} bytes; ask for less (a smaller limit or tail)",
            },
        }
    )
