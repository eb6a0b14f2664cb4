"""The agent's SSH server: key-only auth with a role per key, JSON lines on subsystem ``cetlab``."""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import os
import pwd
import re
import socket
import stat
import struct
import termios
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import asyncssh

from agents.keys import AuthorizedKeys, KeyFileError, StateDirError, check_not_writable_by_others
from agents.limits import (BUDGET_BURST, BUDGET_PER_S, BYTES_PER_COST, LOGIN_TIMEOUT_S, MAX_CHANNELS_PER_CONNECTION, MAX_UNSENT_BYTES,
                           OVER_BUDGET_PAUSE_S, PAUSE_READING_BYTES, Doorman, KeyBudget, KeyTally, ThrottledLog, TokenBucket, reply_line,
                           request_cost)
from agents.protocol import MAX_MESSAGE_BYTES, SUBSYSTEM, ErrorCode, RemoteError, Role, encode
from agents.orchestra.port import ModelsPort
from agents.rpc import Peer, parse_request, request_id_of

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.server")
throttled = ThrottledLog(log)

MAX_CONCURRENT_CALLS = 32  # per channel; further requests wait their turn
FINISH_AFTER_EOF_S = 30.0  # after a console's EOF, its calls in flight get this long to be answered
RATE_PER_S, RATE_BURST = BUDGET_PER_S, BUDGET_BURST  # a connection's budget, in pings
SOCKET_ROLES_NAME = "socket_roles"
MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path, less the terminating NUL


class _Transport(Protocol):
    """What a channel writes to: an SSH channel or a unix socket's transport (both have these)."""

    def write(self, data: bytes) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


class _Channel:
    """One console's JSON-lines stream, whatever carries it (SSH channel, unix socket).

    Requests spend the connection's budget by cost; a console that stops taking its replies
    stops being read (the transport's write buffer says so), and one far behind is closed.
    """

    def __init__(self, agent: Agent, role: Role, who: str, transport: _Transport, budget: TokenBucket | KeyBudget,
                 key: str | None = None):
        self.agent = agent
        self.peer = Peer(role=role, who=who, send=self._send, key=key)
        self._transport = transport
        self._budget = budget
        self._buffer = bytearray()
        self._discarding = False  # inside an oversized line: drop bytes until its newline
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self._tasks: set[asyncio.Task] = set()
        self._finishing: asyncio.Task | None = None  # after EOF: answering the last calls, then closing
        self._holds: set[str] = set()  # why we read nothing from this console now: "unread" replies, over "budget"
        transport.set_write_buffer_limits(high=PAUSE_READING_BYTES)

    def open(self) -> None:
        self.agent.peers.add(self.peer)
        log.info("session opened by %s (%s)", self.peer.who, self.peer.role)

    def _send(self, data: bytes) -> None:
        if self.peer.closed:
            return
        try:
            if self._transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
                throttled(logging.WARNING, "behind", "closed the session of %s: %d bytes not taken (a console that stopped reading)",
                          self.peer.who, self._transport.get_write_buffer_size())
                self.peer.closed = True
                self._transport.close()
                return
            self._transport.write(data)
        except (asyncssh.Error, OSError, RuntimeError):
            self.peer.closed = True

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
            except (asyncssh.Error, OSError, RuntimeError):  # closed meanwhile
                pass

    def _over_budget(self, request_id: Any, message: str) -> None:
        """Answer rate_limited, and read nothing more for a moment: a sender past its budget waits in TCP, not on our CPU."""
        self._reply_error(request_id, ErrorCode.RATE_LIMITED, message)
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
            self._over_budget(None, f"over this connection's budget (long lines cost one ping per {BYTES_PER_COST} bytes); slow down")
            return
        try:
            request = parse_request(line)
        except RemoteError as exc:
            self._send(encode({"id": None, "error": exc.to_wire()}))
            return
        if not self._budget.take(request_cost(request.get("method"), request.get("params"))):
            self._over_budget(request_id_of(request),
                              f"over this connection's budget ({RATE_PER_S:.0f} pings/s, burst {RATE_BURST:.0f}; "
                              "history, logs and lists cost more by size); slow down and retry")
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
        for task in self._tasks:
            task.cancel()
        if self._finishing is not None:
            self._finishing.cancel()
        log.info("session closed by %s", self.peer.who)


class _Session(asyncssh.SSHServerSession):
    """One console's SSH channel (subsystem cetlab) carrying a _Channel."""

    def __init__(self, server: _Server):
        self.server = server
        self.channel: _Channel | None = None

    def connection_made(self, chan: asyncssh.SSHServerChannel) -> None:
        role = self.server.role
        if role is None:  # asyncssh opens sessions only after auth, which sets the role
            raise RuntimeError(f"a session of {self.server.who} opened before its key was accepted")
        self.channel = _Channel(self.server.agent, role, self.server.who, chan, self.server.budget, self.server.key)

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == SUBSYSTEM

    def shell_requested(self) -> bool:
        return False  # no shell: the agent never runs commands from the wire

    def exec_requested(self, command: str) -> bool:
        return False

    def session_started(self) -> None:
        if self.channel is not None:
            self.channel.open()

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self.channel is not None:
            self.channel.feed(data)

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.pause()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.resume()

    def eof_received(self) -> bool:
        if self.channel is not None:
            self.channel.end_of_requests()
        return True  # half-open until the replies are sent; the channel closes itself then

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.channels -= 1
        if self.channel is not None:
            self.channel.close()


def has_spoken(conn: asyncssh.SSHServerConnection) -> bool:
    """Whether a connection sent its SSH version line: parsed already, or waiting unread in the socket (a busy agent
    reads it late; the login door must not take a real client for an idle connection because of that)."""
    if conn.get_extra_info("client_version") is not None:
        return True
    sock = conn.get_extra_info("socket")
    if sock is None:
        return False
    waiting = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
    except (OSError, ValueError):
        return False
    return waiting[0] > 0


def ack_at_once(conn: asyncssh.SSHServerConnection) -> None:
    """ACK each of the client's segments at once (TCP_QUICKACK, re-armed on every read: Linux drops it by itself).

    OpenSSH's client leaves Nagle on until a session is set up, and writes two packets in a row twice in a
    handshake (KEXINIT then KEX_ECDH_INIT; NEWKEYS then SERVICE_REQUEST): the second waits for the ACK of the
    first, which a delayed ACK can hold back 40 ms. A race (whether our KEXINIT left before theirs came): on
    loopback, some runs of the demo lab lost 2 x 40 ms on every `cetlab` login, others none.
    """
    sock = conn.get_extra_info("socket")
    quickack = getattr(socket, "TCP_QUICKACK", None)  # Linux only
    if sock is None or quickack is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    received = conn.data_received

    def data_received(data: bytes, datatype: int | None = None) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
        except OSError:  # closed meanwhile
            pass
        received(data, datatype)

    conn.data_received = data_received  # type: ignore[method-assign]  # the transport calls the protocol's attribute


class _Server(asyncssh.SSHServer):
    def __init__(self, agent: Agent, authorized: AuthorizedKeys, doorman: Doorman, tally: KeyTally):
        self.agent = agent
        self.authorized = authorized
        self.doorman = doorman
        self.tally = tally
        self.role: Role | None = None
        self.who = "?"
        self.key: str | None = None  # the key's fingerprint
        self._counted = False  # in the tally of its key's connections
        self._peername = "?"
        self._conn: asyncssh.SSHServerConnection | None = None
        self.budget: TokenBucket | KeyBudget = TokenBucket()  # shared by the connection's channels (and its key's, once known)
        self.channels = 0

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        peer = conn.get_extra_info("peername")
        self._peername = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._conn = conn
        ack_at_once(conn)
        loop = asyncio.get_running_loop()

        def close() -> None:
            loop.call_soon(conn.abort)

        self.doorman.arrive(self, peer[0] if peer else "?", close, lambda: has_spoken(conn))

    def auth_completed(self) -> None:
        self.doorman.leave(self)
        assert self.key is not None
        if not self.tally.login(self.key, self.who):  # its key's connections are at their cap (several logged in at once)
            self.role = None  # no channel for it
            if self._conn is not None:
                asyncio.get_running_loop().call_soon(self._conn.abort)
            return
        self._counted = True
        self.budget = self.tally.budget(self.key, TokenBucket())

    def connection_lost(self, exc: Exception | None) -> None:
        self.doorman.leave(self)
        if self._counted and self.key is not None:
            self._counted = False
            self.tally.logout(self.key)

    def begin_auth(self, username: str) -> bool:
        self.doorman.authenticating(self)
        return True  # always authenticate; the key decides

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        try:
            entry = self.authorized.lookup(key)
        except KeyFileError as exc:
            throttled(logging.ERROR, "keyfile", "refusing every key: %s", exc)
            return False
        if entry is None:
            throttled(logging.WARNING, "unknown-key", "refused unknown key %s from %s", key.get_fingerprint(), self._peername)
            return False
        fingerprint = key.get_fingerprint()
        if self.tally.full(fingerprint):
            self.tally.login(fingerprint, entry.who)  # (refused: logged, throttled)
            return False
        self.role, self.who, self.key = entry.role, entry.who, fingerprint
        return True

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        """A direct-tcpip forward: only the gateway's key, only to 127.0.0.1 ports of engines this agent runs now."""
        problem = forward_problem(self.agent, self.role, dest_host, dest_port)
        if problem is not None:
            throttled(logging.WARNING, "forward", "refused a forward from %s (%s) to %r:%s: %s",  # %r: the client's
                      self.who, self.role, dest_host[:256], dest_port, problem)  # host, a newline in it forges no log line
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, problem)
        return True  # asyncssh connects to 127.0.0.1:dest_port and pipes the channel both ways

    def session_requested(self) -> asyncssh.SSHServerSession | bool:
        if self.role is None:
            return False
        if self.channels >= MAX_CHANNELS_PER_CONNECTION:
            throttled(logging.WARNING, "channels", "refused a channel from %s: %d open on one connection already",
                      self.who, self.channels)
            return False
        self.channels += 1
        return _Session(self)


def forward_problem(agent: Agent, role: Role | None, dest_host: str, dest_port: int) -> str | None:
    """Why a forward to dest_host:dest_port is refused (None: allowed)."""
    if role is not Role.GATEWAY:
        return "only the gateway's key may open forwards"
    if dest_host != "127.0.0.1":
        return "forwards go to 127.0.0.1 only"
    pool = agent.find(ModelsPort)
    if pool is None or dest_port not in pool.engine_ports():
        return f"no engine runs on port {dest_port} here"
    return None


async def listen(agent: Agent, host: str, port: int, host_key: asyncssh.SSHKey, authorized: AuthorizedKeys) -> asyncssh.SSHAcceptor:
    doorman = Doorman()
    tally = KeyTally()
    return await asyncssh.listen(
        host,
        port,
        server_factory=lambda: _Server(agent, authorized, doorman, tally),
        server_host_keys=[host_key],
        encoding=None,
        login_timeout=LOGIN_TIMEOUT_S,
        keepalive_interval=15,
        keepalive_count_max=4,
        allow_scp=False,
        agent_forwarding=False,
        x11_forwarding=False,
        line_editor=False,
    )


# ---------------------------------------------------------------------------- the unix socket (via: sshd)


class SocketRoles:
    """``<state>/socket_roles``: lines ``operator alice`` / ``viewer bob``, re-read on change.

    The socket's peer is known by its uid (SO_PEERCRED); through sshd that is the user who
    logged in. The agent's own user is always an operator (it owns the state dir anyway);
    anyone else not listed is refused.
    """

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple | None = None
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

    def __init__(self, agent: Agent, roles: SocketRoles):
        self.agent, self.roles = agent, roles
        self.channel: _Channel | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(f"a unix socket's transport is a stream, not {type(transport).__name__}")
        sock = transport.get_extra_info("socket")
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            role, name = self.roles.lookup(uid)
            problem = None if role else f"user {name} (uid {uid}) has no role on this agent: add 'viewer {name}' or 'operator {name}' to {self.roles.path}"
        except KeyFileError as exc:
            role, name, problem = None, str(uid), f"the agent refuses every socket user: {exc}"
        if role is None:
            log.warning("unix socket: refused %s", problem)
            transport.write(encode({"id": None, "error": {"code": ErrorCode.FORBIDDEN.value, "message": problem}}))
            transport.close()
            return
        self.channel = _Channel(self.agent, role, f"{name} (unix socket)", transport, TokenBucket())
        self.channel.open()

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
        if self.channel is not None:
            self.channel.close()


async def listen_unix(agent: Agent, path: Path) -> asyncio.AbstractServer | None:
    """Serve the same protocol on a unix socket (mode 660) for consoles that come through the machine's sshd."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        log.warning("unix socket path %s is longer than %d bytes: via: sshd is off; pass --unix-socket with a shorter path",
                    path, MAX_SOCKET_PATH_BYTES)
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    roles = SocketRoles(agent.state_dir / SOCKET_ROLES_NAME)
    roles.roles()  # a malformed or too-open file fails the start, not the first login
    _refuse_live_socket(path)
    server = await asyncio.get_running_loop().create_unix_server(lambda: _UnixConnection(agent, roles), path=str(path))
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
        raise StateDirError(f"{path}: cannot tell whether an agent serves it ({exc}); pass --unix-socket with another path") from None
    finally:
        probe.close()
    raise StateDirError(f"another agent serves {path}; stop it, or pass this agent another --unix-socket")
