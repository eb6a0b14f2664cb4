"""The agent's SSH server: key-only auth with a role per key, JSON lines on subsystem ``cetlab``."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import asyncssh

from agents.keys import AuthorizedKeys, KeyFileError
from agents.protocol import MAX_MESSAGE_BYTES, SUBSYSTEM, ErrorCode, Role, encode
from agents.rpc import Peer

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.server")

MAX_CONCURRENT_CALLS = 32  # per connection; further requests wait their turn


class _Session(asyncssh.SSHServerSession):
    """One console's channel: split JSON lines, dispatch them, push events."""

    def __init__(self, agent: Agent, role: Role, who: str):
        self.agent = agent
        self.peer = Peer(role=role, who=who, send=self._send)
        self._chan: asyncssh.SSHServerChannel | None = None
        self._buffer = bytearray()
        self._discarding = False  # inside an oversized line: drop bytes until its newline
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self._tasks: set[asyncio.Task] = set()

    def connection_made(self, chan: asyncssh.SSHServerChannel) -> None:
        self._chan = chan

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == SUBSYSTEM

    def shell_requested(self) -> bool:
        return False  # no shell: the agent never runs commands from the wire

    def exec_requested(self, command: str) -> bool:
        return False

    def session_started(self) -> None:
        self.agent.peers.add(self.peer)
        log.info("session opened by %s (%s)", self.peer.who, self.peer.role)

    def _send(self, data: bytes) -> None:
        if self._chan is not None and not self.peer.closed:
            try:
                self._chan.write(data)
            except (asyncssh.Error, OSError, BrokenPipeError):
                self.peer.closed = True

    def data_received(self, data: bytes, datatype) -> None:
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > MAX_MESSAGE_BYTES:
                    if not self._discarding:
                        self._reply_too_large()
                    self._discarding = True
                    self._buffer.clear()
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if self._discarding:  # the tail of an oversized line
                self._discarding = False
                continue
            if len(line) > MAX_MESSAGE_BYTES:
                self._reply_too_large()
                continue
            if line.strip():
                task = asyncio.ensure_future(self._handle(line))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _reply_too_large(self) -> None:
        message = f"message larger than {MAX_MESSAGE_BYTES} bytes; discarded"
        self._send(encode({"id": None, "error": {"code": ErrorCode.TOO_LARGE.value, "message": message}}))

    async def _handle(self, line: bytes) -> None:
        async with self._slots:
            response = await self.agent.rpc.dispatch(self.peer, line)
        self._send(encode(response))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.closed = True
        self.agent.peers.discard(self.peer)
        for task in self._tasks:
            task.cancel()
        log.info("session closed by %s", self.peer.who)


class _Server(asyncssh.SSHServer):
    def __init__(self, agent: Agent, authorized: AuthorizedKeys):
        self.agent = agent
        self.authorized = authorized
        self.role: Role | None = None
        self.who = "?"
        self._peername = "?"

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        peer = conn.get_extra_info("peername")
        self._peername = f"{peer[0]}:{peer[1]}" if peer else "?"

    def begin_auth(self, username: str) -> bool:
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
            log.error("refusing every key: %s", exc)
            return False
        if entry is None:
            log.warning("refused unknown key %s from %s", key.get_fingerprint(), self._peername)
            return False
        self.role, self.who = entry.role, entry.who
        return True

    def session_requested(self) -> asyncssh.SSHServerSession | bool:
        if self.role is None:
            return False
        return _Session(self.agent, self.role, self.who)


async def listen(agent: Agent, host: str, port: int, host_key: asyncssh.SSHKey, authorized: AuthorizedKeys) -> asyncssh.SSHAcceptor:
    return await asyncssh.listen(
        host,
        port,
        server_factory=lambda: _Server(agent, authorized),
        server_host_keys=[host_key],
        encoding=None,
        keepalive_interval=15,
        keepalive_count_max=4,
        allow_scp=False,
        agent_forwarding=False,
        x11_forwarding=False,
        line_editor=False,
    )
