"""One console's JSON-lines stream to the agent, whatever carries it, and the unix socket (`via: sshd`) that carries it.

No asyncssh here: an agent whose consoles come through the machine's sshd (`via: sshd`) never loads the SSH stack
(agents/shell/server.py, ~15 MB of the agent's memory; issue 22)."""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import re
import socket
import stat
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agents.runtime.keys import KeyFileError, StateDirError, check_not_writable_by_others
from agents.runtime.limits import (
    BUDGET_BURST,
    BUDGET_PER_S,
    BYTES_PER_COST,
    MAX_UNSENT_BYTES,
    OVER_BUDGET_PAUSE_S,
    PAUSE_READING_BYTES,
    KeyBudget,
    ThrottledLog,
    TokenBucket,
    reply_line,
    request_cost,
)
from agents.runtime.principals import Account, Principals, Slot, uid_principal
from agents.runtime.rpc import Peer, parse_request, request_id_of
from agents.wire.protocol import MAX_MESSAGE_BYTES, ErrorCode, RemoteError, Role, encode

if TYPE_CHECKING:
    from agents.shell.agent import Agent

log = logging.getLogger("cetlab.server")
throttled = ThrottledLog(log)

MAX_CONCURRENT_CALLS = 32  # per channel; further requests wait their turn
FINISH_AFTER_EOF_S = 30.0  # after a console's EOF, its calls in flight get this long to be answered
RATE_PER_S, RATE_BURST = BUDGET_PER_S, BUDGET_BURST  # a connection's budget, in pings
SOCKET_ROLES_NAME = "socket_roles"
MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path, less the terminating NUL


def _write_errors() -> tuple[type[BaseException], ...]:
    """What a transport's write or resume may raise once the peer is gone (an SSH channel's too, where asyncssh is loaded)."""
    asyncssh = sys.modules.get("asyncssh")
    return (OSError, RuntimeError, asyncssh.Error) if asyncssh is not None else (OSError, RuntimeError)


class _Transport(Protocol):
    """What a channel writes to: an SSH channel or a unix socket's transport (both have these)."""

    def write(self, data: bytes) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


class Channel:
    """One console's JSON-lines stream, whatever carries it (SSH channel, unix socket).

    Requests spend the connection's budget by cost; a console that stops taking its replies
    stops being read (the transport's write buffer says so), and one far behind is closed.
    """

    def __init__(
        self,
        agent: Agent,
        role: Role,
        who: str,
        transport: _Transport,
        budget: TokenBucket | KeyBudget,
        key: str | None = None,
        account: Account | None = None,
    ):
        self.agent = agent
        self.account = account  # its principal's tally: unread replies and refusals are counted with its other channels
        self.peer = Peer(role=role, who=who, send=self._send, key=key)
        self._transport = transport
        self._budget = budget
        self._buffer = bytearray()
        self._discarding = False  # inside an oversized line: drop bytes until its newline
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._finishing: asyncio.Task[None] | None = None  # after EOF: answering the last calls, then closing
        self._holds: set[str] = set()  # why we read nothing from this console now: "unread" replies, over "budget"
        transport.set_write_buffer_limits(high=PAUSE_READING_BYTES)
        if account is not None:
            account.tally.watch(account.name, self)

    def open(self) -> None:
        self.agent.peers.add(self.peer)
        log.info("session opened by %s (%s)", self.peer.who, self.peer.role)

    def _send(self, data: bytes) -> None:
        if self.peer.closed:
            return
        try:
            if self._transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
                throttled(
                    logging.WARNING,
                    "behind",
                    "closed the session of %s: %d bytes not taken (a console that stopped reading)",
                    self.peer.who,
                    self._transport.get_write_buffer_size(),
                )
                self.peer.closed = True
                self._transport.close()
                return
            self._transport.write(data)
            if self.account is not None and self._transport.get_write_buffer_size() > PAUSE_READING_BYTES:
                self.account.tally.check_unread(self.account.name, self.peer.who)
        except _write_errors():
            self.peer.closed = True

    def unread_bytes(self) -> int:
        """Replies written and not yet taken by the console."""
        try:
            return self._transport.get_write_buffer_size()
        except _write_errors():
            return 0

    def drop(self, why: str) -> None:
        """Close this channel: its principal's channels together are too far behind (agents/runtime/principals.py)."""
        log.warning("closed the session of %s: %s", self.peer.who, why)
        self.peer.closed = True
        self._transport.close()

    def pause(self) -> None:
        """The console is not taking its replies: read no more of its requests until it does."""
        self._hold("unread")

    def resume(self) -> None:
        self._release("unread")

    def _hold(self, reason: str) -> None:
        if not self._holds:
            self._transport.pause_reading()
        self._holds.add(reason)

    def _release(self, reason: str) -> None:
        if reason not in self._holds:
            return
        self._holds.discard(reason)
        if not self._holds and not self.peer.closed:
            try:
                self._transport.resume_reading()
            except _write_errors():  # closed meanwhile
                pass

    def _over_budget(self, request_id: Any, message: str) -> None:
        """Answer rate_limited, and read nothing more for a moment: a sender past its budget waits in TCP, not on our CPU."""
        self._reply_error(request_id, ErrorCode.RATE_LIMITED, message)
        if self.account is not None:
            self.account.tally.refused["calls"] += 1  # counted; its log line is the channel's own (throttled below)
        if "budget" not in self._holds:
            self._hold("budget")
            asyncio.get_running_loop().call_later(OVER_BUDGET_PAUSE_S, self._release, "budget")

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > MAX_MESSAGE_BYTES:
                    if not self._discarding:
                        self._reply_error(None, ErrorCode.TOO_LARGE, f"message larger than {MAX_MESSAGE_BYTES} bytes; discarded")
                    self._discarding = True
                    self._buffer.clear()
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if self._discarding:  # the tail of an oversized line
                self._discarding = False
                continue
            if len(line) > MAX_MESSAGE_BYTES:
                self._reply_error(None, ErrorCode.TOO_LARGE, f"message larger than {MAX_MESSAGE_BYTES} bytes; discarded")
                continue
            if line.strip():
                self._accept(line)

    def _accept(self, line: bytes) -> None:
        size_cost = len(line) / BYTES_PER_COST
        if size_cost > 1 and not self._budget.take(size_cost):  # refused before the parser spends time on it
            self._over_budget(
                None, f"over this connection's budget (long lines cost one ping per {BYTES_PER_COST} bytes); slow down"
            )
            return
        try:
            request = parse_request(line)
        except RemoteError as exc:
            self._send(encode({"id": None, "error": exc.to_wire()}))
            return
        if not self._budget.take(request_cost(request.get("method"), request.get("params"))):
            self._over_budget(
                request_id_of(request),
                f"over this connection's budget ({RATE_PER_S:.0f} pings/s, burst {RATE_BURST:.0f}; "
                "history, logs and lists cost more by size); slow down and retry",
            )
            return
        task = asyncio.ensure_future(self._handle(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def end_of_requests(self) -> None:
        """The console sent EOF: it asks nothing more. Answer what it asked, then close the channel.

        A client that waits for the server's close before it exits (OpenSSH's `ssh -s cetlab`,
        `echo '{...}' | ssh ...`) gets its replies and ends, instead of waiting forever.
        """

        async def finish() -> None:
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=FINISH_AFTER_EOF_S)
            exit_with = getattr(self._transport, "exit", None)  # an SSH channel says "status 0" as it closes
            exit_with(0) if exit_with is not None else self._transport.close()

        self._finishing = asyncio.ensure_future(finish())

    def _reply_error(self, request_id: Any, code: ErrorCode, message: str) -> None:
        self._send(encode({"id": request_id, "error": {"code": code.value, "message": message}}))

    async def _handle(self, request: dict[str, Any]) -> None:
        async with self._slots:
            response = await self.agent.rpc.dispatch(self.peer, request)
        self._send(reply_line(response))

    def close(self) -> None:
        self.peer.closed = True
        self.agent.peers.discard(self.peer)
        if self.account is not None:
            self.account.tally.unwatch(self.account.name, self)
        for task in self._tasks:
            task.cancel()
        if self._finishing is not None:
            self._finishing.cancel()
        log.info("session closed by %s", self.peer.who)


# ---------------------------------------------------------------------------- the unix socket (via: sshd)


class SocketRoles:
    """``<state>/socket_roles``: lines ``operator alice`` / ``viewer bob``, re-read on change.

    The socket's peer is known by its uid (SO_PEERCRED); through sshd that is the user who
    logged in. The agent's own user is always an operator (it owns the state dir anyway);
    anyone else not listed is refused.
    """

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._roles: dict[str, Role] = {}

    def roles(self) -> dict[str, Role]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)
        if stamp != self._stamp:
            check_not_writable_by_others(self.path)
            roles = {}
            for number, line in enumerate(self.path.read_text().split("\n"), 1):  # lines end at \n only, as in keys
                parts = [p for p in re.split(r"[ \t]+", line.split("#", 1)[0].strip(" \t\r")) if p]
                if not parts:
                    continue
                if len(parts) != 2 or parts[0] not in Role._value2member_map_:
                    raise KeyFileError(f"{self.path}:{number}: expected '<viewer|operator> <user name or uid>'")
                roles[parts[1]] = Role(parts[0])
            self._roles, self._stamp = roles, stamp
        return self._roles

    def lookup(self, uid: int) -> tuple[Role | None, str]:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        if uid == os.getuid():
            return Role.OPERATOR, name
        roles = self.roles()
        return roles.get(name) or roles.get(str(uid)), name


class _UnixConnection(asyncio.Protocol):
    """One local client of the agent's socket; sshd's direct-streamlocal forwards land here."""

    def __init__(self, agent: Agent, roles: SocketRoles, principals: Principals):
        self.agent, self.roles, self.principals = agent, roles, principals
        self.channel: Channel | None = None
        self._slots: list[Slot] = []  # its uid's connection and channel, in the tally every transport shares

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(f"a unix socket's transport is a stream, not {type(transport).__name__}")
        sock = transport.get_extra_info("socket")
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            role, name = self.roles.lookup(uid)
            problem = (
                None
                if role
                else f"user {name} (uid {uid}) has no role on this agent: add 'viewer {name}' or 'operator {name}' to {self.roles.path}"
            )
        except KeyFileError as exc:
            role, name, problem = None, str(uid), f"the agent refuses every socket user: {exc}"
        if role is None:
            log.warning("unix socket: refused %s", problem)
            transport.write(encode({"id": None, "error": {"code": ErrorCode.FORBIDDEN.value, "message": problem}}))
            transport.close()
            return
        who, principal = f"{name} (unix socket)", uid_principal(uid)
        for kind in ("connection", "channel"):  # one connection is one channel: both count against the uid's caps
            slot = self.principals.take(principal, kind, who)
            if slot is None:
                self._release()
                message = f"user {name} (uid {uid}) has {self.principals.cap(kind)} {kind}s open to this agent already"
                transport.write(encode({"id": None, "error": {"code": ErrorCode.RATE_LIMITED.value, "message": message}}))
                transport.close()
                return
            self._slots.append(slot)
        budget = self.principals.budget(principal, TokenBucket())
        self.channel = Channel(self.agent, role, who, transport, budget, account=Account(self.principals, principal))
        self.channel.open()

    def _release(self) -> None:
        for slot in self._slots:
            slot.release()
        self._slots.clear()

    def data_received(self, data: bytes) -> None:
        if self.channel is not None:
            self.channel.feed(data)

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.pause()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.resume()

    def eof_received(self) -> bool:
        if self.channel is None:
            return False
        self.channel.end_of_requests()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self.channel is not None:
            self.channel.close()


async def listen_unix(agent: Agent, path: Path) -> asyncio.AbstractServer | None:
    """Serve the same protocol on a unix socket (mode 660) for consoles that come through the machine's sshd."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        log.warning(
            "unix socket path %s is longer than %d bytes: via: sshd is off; pass --unix-socket with a shorter path",
            path,
            MAX_SOCKET_PATH_BYTES,
        )
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    roles = SocketRoles(agent.state_dir / SOCKET_ROLES_NAME)
    roles.roles()  # a malformed or too-open file fails the start, not the first login
    _refuse_live_socket(path)
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: _UnixConnection(agent, roles, agent.principals), path=str(path)
    )
    os.chmod(path, 0o660)
    return server


def _refuse_live_socket(path: Path) -> None:
    """Remove the stale socket of a killed agent; refuse a path where a live agent answers, or that is no socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StateDirError(f"{path} exists and is not a socket; pass --unix-socket with another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # nobody listens: a killed agent's leftover
        return
    except OSError as exc:
        raise StateDirError(
            f"{path}: cannot tell whether an agent serves it ({exc}); pass --unix-socket with another path"
        ) from None
    finally:
        probe.close()
    raise StateDirError(f"another agent serves {path}; stop it, or pass this agent another --unix-socket")
