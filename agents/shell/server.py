"""The agent's SSH server: key-only auth with a role per key, JSON lines on subsystem ``cetlab``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections.abc import Awaitable
from typing import TYPE_CHECKING, cast

import asyncssh
from asyncssh.forward import SSHForwarder

from agents.orchestra.port import ModelsPort
from agents.runtime.keys import AuthorizedKeys, KeyFileError
from agents.runtime.limits import LOGIN_TIMEOUT_S, MAX_CHANNELS_PER_CONNECTION, Doorman, KeyBudget, Stage, TokenBucket
from agents.runtime.principals import Account, Slot, key_principal
from agents.shell.channel import RATE_BURST, RATE_PER_S, Channel, throttled  # noqa: F401 (RATE_*: the figures tests read here)
from agents.wire.protocol import SUBSYSTEM, Role

if TYPE_CHECKING:
    from agents.shell.agent import Agent


class _Session(asyncssh.SSHServerSession[bytes]):
    """One console's SSH channel (subsystem cetlab) carrying a Channel."""

    def __init__(self, server: _Server, slot: Slot):
        self.server = server
        self.slot = slot  # one of its key's channels, in the tally every transport shares
        self.channel: Channel | None = None

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        role = self.server.role
        if role is None:  # asyncssh opens sessions only after auth, which sets the role
            raise RuntimeError(f"a session of {self.server.who} opened before its key was accepted")
        key = self.server.key
        account = Account(self.server.principals, key_principal(key)) if key is not None else None
        self.channel = Channel(self.server.agent, role, self.server.who, chan, self.server.budget, key, account)

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
        self.slot.release()
        if self.channel is not None:
            self.channel.close()


class Handshake:
    """How far a connection's bytes have come before login, for the login door (Stage): what asyncssh has read of it,
    and what waits unread in its socket (a busy agent reads late: the door must not take a real client for a storm's)."""

    HEAD_BYTES = 512  # a version line is at most 255; a KEXINIT's first bytes follow it

    def __init__(self, conn: asyncssh.SSHServerConnection):
        self._sock = conn.get_extra_info("socket")
        self._head = b""  # the first bytes the connection sent
        received = conn.data_received

        def data_received(data: bytes, datatype: int | None = None) -> None:
            if len(self._head) < self.HEAD_BYTES:
                self._head += data[: self.HEAD_BYTES - len(self._head)]
            received(data, datatype)

        conn.data_received = data_received  # type: ignore[method-assign]  # the transport calls the protocol's attribute

    def stage(self) -> Stage:
        seen = self._head
        newline = seen.find(b"\n")
        if newline < 0 or len(seen) == newline + 1:  # not past its version line yet, as far as asyncssh has read
            seen += self._peek(self.HEAD_BYTES - len(seen))
            newline = seen.find(b"\n")
        if newline < 0:
            return Stage.VERSION if seen else Stage.SILENT
        return Stage.KEX if len(seen) > newline + 1 else Stage.VERSION

    def _peek(self, size: int) -> bytes:
        """Bytes waiting unread in the socket, left there (a duplicate of its fd, so asyncio's socket stays its own)."""
        if self._sock is None or size <= 0:
            return b""
        try:
            with socket.fromfd(self._sock.fileno(), self._sock.family, self._sock.type) as dup:
                return dup.recv(size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (OSError, ValueError):  # nothing waiting (EAGAIN), or closed meanwhile
            return b""


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
    def __init__(self, agent: Agent, authorized: AuthorizedKeys, doorman: Doorman):
        self.agent = agent
        self.authorized = authorized
        self.doorman = doorman
        self.principals = agent.principals
        self.role: Role | None = None
        self.who = "?"
        self.key: str | None = None  # the key's fingerprint
        self._slot: Slot | None = None  # its place among its key's connections
        self._peername = "?"
        self._conn: asyncssh.SSHServerConnection | None = None
        self.budget: TokenBucket | KeyBudget = TokenBucket()  # shared by the connection's channels (and its key's, once known)
        self.channels = 0

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        peer = conn.get_extra_info("peername")
        self._peername = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._conn = conn
        ack_at_once(conn)
        handshake = Handshake(conn)
        loop = asyncio.get_running_loop()

        def close() -> None:
            loop.call_soon(conn.abort)

        self.doorman.arrive(self, peer[0] if peer else "?", close, handshake.stage)

    def auth_completed(self) -> None:
        self.doorman.leave(self)
        assert self.key is not None
        principal = key_principal(self.key)
        self._slot = self.principals.take(principal, "connection", self.who)
        if self._slot is None:  # its key's connections are at their cap (several logged in at once)
            self.role = None  # no channel for it
            if self._conn is not None:
                asyncio.get_running_loop().call_soon(self._conn.abort)
            return
        self.budget = self.principals.budget(principal, TokenBucket())

    def connection_lost(self, exc: Exception | None) -> None:
        self.doorman.leave(self)
        if self._slot is not None:
            self._slot.release()

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
        principal = key_principal(fingerprint)
        if self.principals.full(principal, "connection"):
            self.principals.refuse(principal, "connection", entry.who, f"{self.principals.cap('connection')} are open")
            return False
        self.role, self.who, self.key = entry.role, entry.who, fingerprint
        self.doorman.known_key(self)
        return True

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        """A direct-tcpip forward: only the gateway's key, only to 127.0.0.1 ports of engines this agent runs now."""
        problem = forward_problem(self.agent, self.role, dest_host, dest_port)
        if problem is not None:
            throttled(
                logging.WARNING,
                "forward",
                "refused a forward from %s (%s) to %r:%s: %s",  # %r: the client's
                self.who,
                self.role,
                dest_host[:256],
                dest_port,
                problem,
            )  # host, a newline in it forges no log line
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, problem)
        forwarding = self._counted_forward(self._forwarder().forward_connection(dest_host, dest_port))
        return cast("Awaitable[asyncssh.SSHTCPSession[bytes]]", forwarding)  # a forwarder is the session asyncssh pipes

    def _forwarder(self) -> asyncssh.SSHServerConnection:
        if self._conn is None or self.key is None:  # asyncssh opens channels only after auth, which sets both
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "not logged in")
        return self._conn

    def _counted_forward(self, opening: Awaitable[SSHForwarder]) -> Awaitable[SSHForwarder]:
        """The forward asyncssh pipes both ways, held as one of its key's forwards until either end closes; refused
        (with the reason, to the client) when the key holds its cap."""
        assert self.key is not None
        slot = self.principals.take(key_principal(self.key), "forward", self.who)
        if slot is None:
            if inspect.iscoroutine(opening):
                opening.close()  # never awaited: no connection to the engine was made
            cap = self.principals.cap("forward")
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE, f"this key holds {cap} forwards already (the cap); close some first"
            )

        async def counted() -> SSHForwarder:
            try:
                forwarder = await opening
            except BaseException:
                slot.release()
                raise
            lost = forwarder.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                slot.release()
                lost(exc)

            forwarder.connection_lost = connection_lost  # type: ignore[method-assign]  # the channel calls its session's
            return forwarder

        return counted()

    def unix_connection_requested(self, dest_path: str) -> Awaitable[asyncssh.SSHUNIXSession[bytes]]:
        """A direct-streamlocal forward: only the gateway's key, only to the sockets of engines this agent runs now."""
        problem = socket_forward_problem(self.agent, self.role, dest_path)
        if problem is not None:
            throttled(
                logging.WARNING,
                "forward",
                "refused a forward from %s (%s) to socket %r: %s",  # %r: the client's path, a newline in it forges no line
                self.who,
                self.role,
                dest_path[:256],
                problem,
            )
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, problem)
        # asyncssh connects to the engine's socket and pipes the channel both ways, held as one of the key's forwards
        forwarding = self._counted_forward(self._forwarder().forward_unix_connection(dest_path))
        return cast("Awaitable[asyncssh.SSHUNIXSession[bytes]]", forwarding)

    def session_requested(self) -> asyncssh.SSHServerSession[bytes] | bool:
        if self.role is None or self.key is None:
            return False
        if self.channels >= MAX_CHANNELS_PER_CONNECTION:
            throttled(
                logging.WARNING,
                "channels",
                "refused a channel from %s: %d open on one connection already",
                self.who,
                self.channels,
            )
            return False
        slot = self.principals.take(key_principal(self.key), "channel", self.who)
        if slot is None:
            return False
        self.channels += 1
        return _Session(self, slot)


def forward_problem(agent: Agent, role: Role | None, dest_host: str, dest_port: int) -> str | None:
    """Why a forward to dest_host:dest_port is refused (None: allowed): the gateway's key to an engine's port, a node key
    to an rpc-server this agent runs for a model spread over it; 127.0.0.1 only."""
    if role is Role.NODE:
        pool = agent.find(ModelsPort)
        if dest_host != "127.0.0.1":
            return "forwards go to 127.0.0.1 only"
        if pool is None or dest_port not in pool.rpc_ports():
            return f"no rpc-server runs on port {dest_port} here"
        return None
    if role is not Role.GATEWAY:
        return "only the gateway's key may open forwards"
    if dest_host != "127.0.0.1":
        return "forwards go to 127.0.0.1 only"
    pool = agent.find(ModelsPort)
    if pool is None or dest_port not in pool.engine_ports():
        return f"no engine runs on port {dest_port} here"
    return None


def socket_forward_problem(agent: Agent, role: Role | None, dest_path: str) -> str | None:
    """Why a forward to the unix socket dest_path is refused (None: allowed): the path must be, exactly, one an engine
    of this agent listens on now (each in a 0700 folder of the agent's: its state dir's models/<model>.run/)."""
    if role is not Role.GATEWAY:
        return "only the gateway's key may open forwards"
    pool = agent.find(ModelsPort)
    if pool is None or dest_path not in pool.engine_sockets():
        return "no engine of this agent listens on that socket"
    return None


async def listen(
    agent: Agent, host: str, port: int, host_key: asyncssh.SSHKey, authorized: AuthorizedKeys
) -> asyncssh.SSHAcceptor:
    doorman = Doorman()
    return await asyncssh.listen(
        host,
        port,
        server_factory=lambda: _Server(agent, authorized, doorman),
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
