"""The one client core for JSON-RPC links to agents: the console's FleetClient, the CLI and the agents' peers.

A ``Link`` per machine with one state machine (``LinkStatus``), one pending table (request id -> future,
failed with typed DISCONNECTED or TIMEOUT errors), one backoff, one read loop (lines bounded by
MAX_REPLY_BYTES), event dispatch (tick, log, notice) and the hello check. Ticks go into the machine's typed
view (agents/runtime/view.py). What differs between clients is only how a transport is opened: an ``Opener``
(FleetClient: direct, via the machine's sshd, or OpenSSH; PeerClient: the peer key, with its tunnels).

asyncssh is never imported here: a CLI verb over OpenSSH never loads it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agents.runtime.view import LabView
from agents.runtime.waits import wait_event
from agents.wire.events import EventInvalid, PushEvent, TickEvent, parse_event
from agents.wire.lab.machines import Machine
from agents.wire.protocol import MAX_REPLY_BYTES, PROTOCOL_VERSION, ErrorCode, LinkStatus, RemoteError, encode

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger("cetlab.link")

BACKOFF_START_S = 0.5

# (machine, event, data) -> None: every event an agent pushes (tick, log, notice), typed (agents/wire/events.py), after a
# tick reached the view; an event that does not validate never reaches it
EventHandler = Callable[[str, str, PushEvent], None]


class LineReader(Protocol):
    """asyncssh's reader contract: readline() gives a line, or a piece of a long one, b"" at the end."""

    async def readline(self) -> bytes: ...


class LineWriter(Protocol):
    def write(self, data: bytes, /) -> None: ...


@dataclass
class Transport:
    """An open byte stream to one agent's JSON-RPC channel, and how to close it."""

    reader: LineReader
    writer: LineWriter
    close: Callable[[], Awaitable[None]]
    conn: asyncssh.SSHClientConnection | None = None  # the SSH connection under it, where asyncssh holds one (tunnels ride it)
    ended: Callable[[], Awaitable[RemoteError]] | None = (
        None  # why the stream ended, where the transport can say (OpenSSH's exit)
    )


class Opener(Protocol):
    """How one kind of client reaches an agent: the only part that differs between clients."""

    async def open(self, link: Link) -> Transport:
        """Connect to the link's machine and open its channel (bounded in time)."""
        ...

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        """A failed attempt in this client's words (a key to authorize, a host key to check), or None for the core's."""
        ...


def ssh_error(name: str, *also: type[BaseException]) -> tuple[type[BaseException], ...]:
    """For an `except`: asyncssh's exception class by name (none where asyncssh was never loaded), and `also`."""
    module = sys.modules.get("asyncssh")
    return (*also, getattr(module, name)) if module is not None else also


async def read_line(reader: LineReader, limit: int = MAX_REPLY_BYTES) -> bytes | None:
    """One whole line (asyncssh's readline hands back pieces of lines longer than its window).

    None at the end of the stream; b"" for a line longer than `limit`, read to its end and dropped.
    """
    parts: list[bytes] = []
    size = 0
    while True:
        piece = await reader.readline()
        if not piece:
            return None
        size += len(piece)
        if size <= limit + 1:
            parts.append(piece)
        if piece.endswith(b"\n"):
            return b"".join(parts) if size <= limit + 1 else b""


def describe(exc: BaseException) -> str:
    """A failed connection in a line a user can act on."""
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer (timed out)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the agent running?)"
    if isinstance(exc, ssh_error("DisconnectError")):
        return f"disconnected: {getattr(exc, 'reason', exc)}"
    return str(exc) or type(exc).__name__


def _remote_error(error: Any) -> RemoteError:
    """An error object from the wire as a typed RemoteError (a malformed one is still an error, never a crash)."""
    if not isinstance(error, dict):
        return RemoteError(ErrorCode.INTERNAL, f"malformed error: {str(error)[:200]}")
    data = error.get("data")
    return RemoteError(
        str(error.get("code", ErrorCode.INTERNAL)), str(error.get("message", "")), data if isinstance(data, dict) else None
    )


@dataclass(eq=False)
class Link:
    """The live connection to one agent."""

    machine: Machine
    status: LinkStatus = LinkStatus.CONNECTING
    error: str | None = None
    transport: Transport | None = None
    pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set once the first attempt is online or has failed
    online: asyncio.Event = field(default_factory=asyncio.Event)  # set while the link is online
    backoff_s: float = BACKOFF_START_S
    retry: asyncio.Event = field(default_factory=asyncio.Event)  # set: the wait before the next attempt ends now
    last_message: float = 0.0  # monotonic time of the last line from the agent
    invalid_events: set[tuple[str, str]] = field(default_factory=set)  # (event, field) of events dropped: logged once each

    @property
    def name(self) -> str:
        return self.machine.name

    @property
    def writer(self) -> LineWriter | None:
        return self.transport.writer if self.transport is not None else None

    @property
    def conn(self) -> asyncssh.SSHClientConnection | None:
        return self.transport.conn if self.transport is not None else None

    def unavailable(self) -> RemoteError:
        """Why a call cannot go to this machine now."""
        return RemoteError(ErrorCode.DISCONNECTED, f"{self.name} is {self.status}" + (f": {self.error}" if self.error else ""))


@dataclass(frozen=True)
class LinkSettings:
    """How a client's links behave: what they subscribe to, how long they wait, how they back off."""

    topics: list[str]  # events to subscribe to once online (none: calls only, and no silence watch)
    call_timeout_s: float
    connect_timeout_s: float  # opening the transport, and the hello
    keepalive_s: float  # the SSH keepalive; a subscribed link silent for twice this (or 3 ticks) is dropped
    backoff_max_s: float  # retries double from BACKOFF_START_S up to this; refused and untrusted links wait this long
    reconnect: bool = True  # False: one attempt per link (the CLI)


# Called once hello has passed, before the link subscribes and reads as online (the console seeds its sparklines).
Connected = Callable[[Link], Awaitable[None]]


class LinkCore:
    """Links to a set of machines: connects each, reconnects with backoff, calls, and keeps their views current."""

    def __init__(
        self,
        machines: Iterable[Machine],
        opener: Opener,
        view: LabView,
        settings: LinkSettings,
        *,
        on_event: EventHandler | None = None,
        on_connected: Connected | None = None,
    ):
        self.opener = opener
        self.view = view
        self.settings = settings
        self.on_event = on_event
        self.on_connected = on_connected
        self.links: dict[str, Link] = {m.name: Link(m) for m in machines}
        self._ids = itertools.count(1)

    # -- lifecycle

    def start(self, names: Iterable[str] | None = None) -> None:
        """Start connecting these links (all by default); each keeps trying until stop()."""
        for name in self.links if names is None else names:
            link = self.links[name]
            link.task = asyncio.create_task(self._run(link), name=f"link-{name}")

    def retry_now(self) -> None:
        """The links that are not online try again now, not at the end of their backoff (the fix was just made:
        a host key pinned, a key authorized by `cetlab lab push`)."""
        for link in self.links.values():
            if link.status is not LinkStatus.ONLINE:
                link.backoff_s = BACKOFF_START_S
                link.retry.set()

    async def stop(self) -> None:
        tasks = [link.task for link in self.links.values() if link.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every started link is online or has failed its first attempt (at most `timeout` s)."""
        waits = [asyncio.ensure_future(link.settled.wait()) for link in self.links.values() if link.task is not None]
        if not waits:
            return
        _done, pending = await asyncio.wait(waits, timeout=timeout)
        for waiting in pending:
            waiting.cancel()

    def set_status(self, link: Link, status: LinkStatus, error: str | None = None) -> None:
        """The one place a link changes state; its view gets a copy for the screens, the CLI and the router."""
        link.status, link.error = status, error
        self.view.set_link(link.name, status, error)

    # -- calls

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Call a method on one agent and return its reply as JSON, checked against the method's result model in the
        catalogue; raises RemoteError (DISCONNECTED, TIMEOUT, the agent's own, or ReplyInvalid naming the field)."""
        from agents.wire.catalogue.index import CATALOGUE
        from agents.wire.catalogue.method import validate_reply  # deferred: ~100 models to build, not on a cold CLI's import path
        from agents.wire.catalogue.verbs import lacks_error

        hello = self.view.machines[machine].hello if machine in self.view.machines else None
        if hello is not None and hello.methods is not None and method not in hello.methods and method in CATALOGUE:
            raise lacks_error(machine, hello.agent_version, method)  # an older agent: said before asking it
        try:
            raw = await self._call(machine, method, params, timeout)
        except RemoteError as exc:
            said = hello is not None and hello.methods is not None  # else an older agent: its catalogue is not known
            if exc.code == ErrorCode.METHOD_NOT_FOUND and method in CATALOGUE and not said:
                raise lacks_error(machine, hello.agent_version if hello else None, method) from None
            raise
        known = CATALOGUE.get(method)
        if known is not None:
            validate_reply(known, raw, machine)  # readers that want the model use catalogue.request(), which parses it again
        return raw

    async def _call(self, machine: str, method: str, params: dict[str, Any] | None, timeout: float | None) -> Any:
        link = self.links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no machine named {machine!r} in the lab")
        if link.transport is None:
            raise link.unavailable()
        limit = timeout or self.settings.call_timeout_s
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        try:
            link.transport.writer.write(encode({"id": request_id, "method": method, "params": params or {}}))
            async with asyncio.timeout(limit):  # no extra task, unlike wait_for
                return await future
        except TimeoutError:
            raise RemoteError(ErrorCode.TIMEOUT, f"{machine} did not answer {method} within {limit:.0f} s") from None
        except ssh_error("Error", OSError) as exc:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine}: connection lost ({exc})") from None
        finally:
            link.pending.pop(request_id, None)

    async def call_all(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Call every machine; each value is a result or the RemoteError it raised."""
        names = list(self.links)
        results = await asyncio.gather(*(self.call(n, method, params, timeout) for n in names), return_exceptions=True)
        return dict(zip(names, results))

    # -- the connection loop

    async def _run(self, link: Link) -> None:
        while True:
            try:
                await self._session(link)
                self.set_status(link, LinkStatus.OFFLINE, "the agent closed the connection")
            except ssh_error("Error", RemoteError, OSError, asyncio.TimeoutError) as exc:
                status, message = await self._explain(link, exc)
                self.set_status(link, status, message)
                if status is not LinkStatus.OFFLINE:  # the fix is on a machine, not in waiting: retry slowly
                    link.backoff_s = self.settings.backoff_max_s
            except Exception as exc:  # a bug here or a hostile agent: never a link that reads online with no loop behind it
                log.exception("%s: the link failed unexpectedly; reconnecting", link.name)
                self.set_status(link, LinkStatus.OFFLINE, f"the link failed unexpectedly: {describe(exc)}")
            finally:
                await self._drop(link)
            log.info("%s: %s (%s)", link.name, link.status, link.error)
            link.settled.set()
            if not self.settings.reconnect:
                return
            delay = link.backoff_s * (0.8 + 0.4 * random.random())
            link.backoff_s = min(self.settings.backoff_max_s, link.backoff_s * 2)
            link.retry.clear()
            await wait_event(link.retry, delay)  # not wait_for: a stop() right after retry_now() must end this loop

    async def _explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str]:
        said = await self.opener.explain(link, exc)
        if said is not None:
            return said
        if isinstance(exc, ssh_error("HostKeyNotVerifiable")):
            return LinkStatus.UNTRUSTED, f"the host key of {link.name} is not trusted (or it changed): {exc}"
        if isinstance(exc, ssh_error("PermissionDenied")):
            return LinkStatus.REFUSED, f"{link.name} refused our key"
        if isinstance(exc, RemoteError):  # FORBIDDEN: e.g. a socket user without a role: retrying will not help
            return (LinkStatus.REFUSED if exc.code == ErrorCode.FORBIDDEN else LinkStatus.OFFLINE), exc.message
        return LinkStatus.OFFLINE, describe(exc)

    async def _session(self, link: Link) -> None:
        from agents.wire.catalogue.agent import HELLO
        from agents.wire.catalogue.method import validate_reply  # deferred, as in call()

        machine = link.machine
        link.transport = await self.opener.open(link)
        link.last_message = time.monotonic()
        reader_task = asyncio.create_task(self._read(link, link.transport))
        try:
            # the version first: another protocol's hello may not fit this one's model
            raw = await self._call(machine.name, HELLO.name, None, self.settings.connect_timeout_s)
            said = raw.get("protocol") if isinstance(raw, dict) else None
            if said != PROTOCOL_VERSION:
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"the agent speaks protocol {said}, this client {PROTOCOL_VERSION}: upgrade one of them",
                )
            hello = validate_reply(HELLO, raw, machine.name)
            if hello.machine != machine.name:  # another agent at this address (a taken port or socket)
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"the agent at {machine.host} answers as machine {hello.machine!r}, "
                    f"not {machine.name!r}: check host, port and socket in lab.yaml; refusing it",
                )
            self.view.set_hello(machine.name, hello)
            if self.on_connected is not None:
                await self.on_connected(link)
            if self.settings.topics:
                await self.call(machine.name, "subscribe", {"topics": self.settings.topics})
            self.set_status(link, LinkStatus.ONLINE)
            link.backoff_s = BACKOFF_START_S
            link.online.set()
            link.settled.set()
            await self._watch(link, reader_task, hello.sample_interval_s)
        finally:
            reader_task.cancel()
            if reader_task.done() and not reader_task.cancelled():
                reader_task.exception()  # raised to the waiting call already; retrieved here, not logged as lost

    async def _watch(self, link: Link, reader_task: asyncio.Task[None], interval_s: float) -> None:
        """Return when the stream ends or goes silent (faster than SSH keepalives notice)."""
        silent_after = max(3 * interval_s + 2.0, self.settings.keepalive_s * 2)
        while not reader_task.done():
            await asyncio.wait({reader_task}, timeout=1.0)
            silent_s = time.monotonic() - link.last_message
            if self.settings.topics and silent_s > silent_after:
                # the threshold, not a count: the card's "last seen ... ago" is the one figure that moves
                raise RemoteError(ErrorCode.DISCONNECTED, f"went silent: no data within {silent_after:.0f} s")
        reader_task.result()

    async def _read(self, link: Link, transport: Transport) -> None:
        name = link.name
        while True:
            line = await read_line(transport.reader)
            if line is None:
                if transport.ended is not None:  # the transport can say why (ssh's exit): to the calls waiting too (`hello`)
                    failure = await transport.ended()
                    self._fail_pending(link, failure)
                    raise failure
                return
            link.last_message = time.monotonic()
            if not line:  # longer than any reply may be: dropped whole
                log.warning("%s sent a line longer than %d bytes; dropped", name, MAX_REPLY_BYTES)
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than Python parses
                log.warning("%s sent a line that is not JSON (%s); dropped", name, describe(exc))
                continue
            if not isinstance(message, dict):
                log.warning("%s sent a line that is not a JSON object", name)
                continue
            if "event" in message:
                self._dispatch(link, message)
                continue
            future = link.pending.get(message["id"]) if isinstance(message.get("id"), int) else None
            if future is None or future.done():
                self._unanswered(link, message)
            elif "error" in message:
                future.set_exception(_remote_error(message["error"]))
            else:
                future.set_result(message.get("result"))

    def _dispatch(self, link: Link, message: dict[str, Any]) -> None:
        """A pushed event, typed where it enters: into the view (a tick), then to on_event. One that does not
        validate is dropped, logged once per event and field; the read loop goes on."""
        try:
            event = parse_event(message["event"], message.get("data"))
        except EventInvalid as exc:
            if (exc.event, exc.field) not in link.invalid_events:
                link.invalid_events.add((exc.event, exc.field))
                log.warning("%s pushed an invalid event, dropped (and the like of it from now on, silently): %s", link.name, exc)
            return
        if isinstance(event, TickEvent):
            self.view.apply_tick(link.name, event)
        if self.on_event is not None:
            try:
                self.on_event(link.name, event.event, event)
            except Exception as exc:  # the handler's bug, not the link's: logged once per event and exception, the loop goes on
                kind = (event.event, f"handler {type(exc).__name__}")
                if kind not in link.invalid_events:
                    link.invalid_events.add(kind)
                    log.exception("%s: the handler of its %r event failed (logged once)", link.name, event.event)

    def _unanswered(self, link: Link, message: dict[str, Any]) -> None:
        """A reply no call waits for; an error without an id is the agent refusing us at the door (a unix socket)."""
        error = message.get("error")
        if not isinstance(error, dict):
            return
        log.warning("%s: %s", link.name, error.get("message"))
        if error.get("code") == ErrorCode.FORBIDDEN and message.get("id") is None:
            self._fail_pending(link, RemoteError(ErrorCode.FORBIDDEN, str(error.get("message", ""))))

    def _fail_pending(self, link: Link, exc: Exception) -> None:
        for future in link.pending.values():
            if not future.done():
                future.set_exception(exc)

    async def _drop(self, link: Link) -> None:
        link.online.clear()
        self._fail_pending(link, RemoteError(ErrorCode.DISCONNECTED, f"{link.name}: connection lost"))
        link.pending.clear()
        transport, link.transport = link.transport, None
        if transport is not None:
            await transport.close()
