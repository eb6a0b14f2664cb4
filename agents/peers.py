"""Agent-to-agent client: one SSH channel per peer agent, verified host keys, calls and tick sections."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import asyncssh

from agents.keys import ensure_key
from agents.lab import Lab, Machine
from agents.protocol import EVENT_TICK, PROTOCOL_VERSION, SSH_USERNAME, SUBSYSTEM, ErrorCode, RemoteError, encode

log = logging.getLogger("cetlab.peers")

PEER_KEY_NAME = "peer_ed25519_key"  # this agent's client key; authorize its .pub on the peers (with the least role that works)
PEER_KNOWN_HOSTS_NAME = "peer_known_hosts"  # the peers' host keys; never trusted on first use
NODE_KEY_NAME = "node_ed25519_key"  # the key a multi-node job's coordinator calls the other nodes with (role node there)
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 15.0
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0

TUNNEL_BACKLOG = 2048  # as the engines' own (uvicorn's): a burst of streams queues, never refused (asyncssh's listener: 100)
TUNNEL_CHUNK_BYTES = 256 * 1024


async def _forward(conn: asyncssh.SSHClientConnection, path: str, port: int) -> asyncio.Server:
    """Listen on the unix socket ``path``; each connection becomes a direct-tcpip channel to 127.0.0.1:``port`` on
    the far side of ``conn``, bytes copied both ways as they come (half-closes passed on)."""

    async def copy(source: asyncio.StreamReader | asyncssh.SSHReader, sink: asyncio.StreamWriter | asyncssh.SSHWriter) -> None:
        try:
            while chunk := await source.read(TUNNEL_CHUNK_BYTES):
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except (OSError, asyncssh.Error):
            pass

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            far_reader, far_writer = await conn.open_connection("127.0.0.1", port, encoding=None)
        except (OSError, asyncssh.Error) as exc:
            log.warning("forward to port %d refused: %s", port, exc)
            writer.close()
            return
        try:
            await asyncio.gather(copy(reader, far_writer), copy(far_reader, writer))
        finally:
            far_writer.close()
            writer.close()

    return await asyncio.start_unix_server(handle, path, backlog=TUNNEL_BACKLOG, limit=TUNNEL_CHUNK_BYTES)


# (machine, changed sections of a tick, full) -> None
TickHandler = Callable[[str, dict[str, Any], bool], None]


@dataclass(eq=False)
class PeerLink:
    """The live connection to one peer agent and what its ticks said last."""

    machine: Machine
    state: str = "connecting"  # connecting | online | offline | refused | untrusted
    error: str | None = None
    sections: dict[str, Any] = field(default_factory=dict)
    writer: asyncssh.SSHWriter | None = None
    conn: asyncssh.SSHClientConnection | None = None
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    task: asyncio.Task | None = None
    backoff_s: float = BACKOFF_START_S
    online: asyncio.Event = field(default_factory=asyncio.Event)
    tunnels: dict[int, tuple[asyncio.Server, str]] = field(default_factory=dict)  # peer's engine port -> (forward, its socket)
    tunnel_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PeerClient:
    """Connects this agent to the other agents of the lab (and to itself), as an SSH client.

    The key is ``<state>/peer_ed25519_key`` (made on first use); host keys are checked against
    ``<state>/peer_known_hosts``. Ticks of the ``sections`` asked for are kept per machine and
    passed to ``on_tick``; ``call`` runs a method on one peer, with typed errors.
    """

    def __init__(self, lab: Lab, state_dir: Path, machines: list[str] | None = None, topics: list[str] | None = None,
                 on_tick: TickHandler | None = None, key_name: str = PEER_KEY_NAME):
        self.lab = lab
        self.key_path = state_dir / key_name
        self.known_hosts = state_dir / PEER_KNOWN_HOSTS_NAME
        self.topics = topics if topics is not None else [EVENT_TICK]
        self.on_tick = on_tick
        wanted = machines if machines is not None else [m.name for m in lab.machines]
        self.links = {name: PeerLink(lab.machine(name)) for name in wanted}
        self._ids = itertools.count(1)
        self._key: asyncssh.SSHKey | None = None
        self._tunnel_dir: Path | None = None

    async def start(self) -> None:
        self._key = ensure_key(self.key_path, comment="cetlab-peer")
        for link in self.links.values():
            link.task = asyncio.create_task(self._run(link), name=f"peer-{link.machine.name}")

    async def stop(self) -> None:
        for link in self.links.values():
            if link.task is not None:
                link.task.cancel()
            if link.conn is not None:
                link.conn.close()
        await asyncio.gather(*(link.task for link in self.links.values() if link.task), return_exceptions=True)
        if self._tunnel_dir is not None:
            shutil.rmtree(self._tunnel_dir, ignore_errors=True)

    async def call(self, machine: str, method: str, params: dict | None = None, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Call a method on one peer; raises RemoteError (DISCONNECTED, TIMEOUT or the peer's own)."""
        link = self.links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no peer named {machine!r}")
        if link.writer is None:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine} is {link.state}" + (f": {link.error}" if link.error else ""))
        request_id = next(self._ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        try:
            link.writer.write(encode({"id": request_id, "method": method, "params": params or {}}))
            async with asyncio.timeout(timeout):
                return await future
        except asyncio.TimeoutError:
            raise RemoteError(ErrorCode.TIMEOUT, f"{machine} did not answer {method} within {timeout:.0f} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine}: connection lost ({exc})") from None
        finally:
            link.pending.pop(request_id, None)

    async def tunnel(self, machine: str, port: int) -> str:
        """A unix socket on this machine that reaches 127.0.0.1:``port`` on ``machine`` through our SSH connection
        to its agent (a direct-tcpip forward per connection; that agent allows it to its engines' ports only, for
        the gateway's key only). The socket is in a folder only this agent's user can enter: no other local user
        reaches a remote engine through it. Raises RemoteError(DISCONNECTED) while the peer is not connected."""
        link = self.links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no peer named {machine!r}")
        async with link.tunnel_lock:
            found = link.tunnels.get(port)
            if found is not None:
                return found[1]
            if link.conn is None or link.writer is None:
                raise RemoteError(ErrorCode.DISCONNECTED, f"{machine} is {link.state}" + (f": {link.error}" if link.error else ""))
            if self._tunnel_dir is None:  # short, private (0700), and gone with the agent; sun_path holds 107 bytes
                self._tunnel_dir = Path(tempfile.mkdtemp(prefix="cetlab-tunnels-"))
            path = str(self._tunnel_dir / f"{machine}-{port}.sock")
            Path(path).unlink(missing_ok=True)
            try:
                listener = await _forward(link.conn, path, port)
            except OSError as exc:
                raise RemoteError(ErrorCode.DISCONNECTED, f"{machine}: cannot forward to its port {port} ({exc})") from None
            link.tunnels[port] = (listener, path)
            return path

    # -- the connection loop

    async def _run(self, link: PeerLink) -> None:
        while True:
            try:
                await self._session(link)
                link.state, link.error = "offline", "the agent closed the connection"
            except asyncssh.HostKeyNotVerifiable as exc:
                link.state, link.error = "untrusted", f"host key of {link.machine.name} not in {self.known_hosts} (or changed): {exc}"
                link.backoff_s = BACKOFF_MAX_S
            except asyncssh.PermissionDenied:
                link.state, link.error = "refused", f"{link.machine.name} refused our key {self.key_path}.pub: authorize it there"
                link.backoff_s = BACKOFF_MAX_S
            except RemoteError as exc:
                link.state, link.error = "offline", exc.message
            except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
                link.state, link.error = "offline", str(exc) or type(exc).__name__
            finally:
                self._drop(link)
            log.info("peer %s: %s (%s)", link.machine.name, link.state, link.error)
            delay = link.backoff_s * (0.8 + 0.4 * random.random())
            link.backoff_s = min(BACKOFF_MAX_S, link.backoff_s * 2)
            await asyncio.sleep(delay)

    async def _session(self, link: PeerLink) -> None:
        machine = link.machine
        link.conn = await asyncio.wait_for(asyncssh.connect(
            machine.host, machine.port, username=SSH_USERNAME, client_keys=[self._key],
            known_hosts=str(self.known_hosts) if self.known_hosts.exists() else asyncssh.import_known_hosts(""),
            agent_path=None, config=None, keepalive_interval=5, keepalive_count_max=3, preferred_auth="publickey",
        ), CONNECT_TIMEOUT_S)
        link.writer, reader, _ = await asyncio.wait_for(link.conn.open_session(subsystem=SUBSYSTEM, encoding=None), CONNECT_TIMEOUT_S)
        reader_task = asyncio.create_task(self._read(link, reader))
        try:
            hello = await self.call(machine.name, "hello", timeout=CONNECT_TIMEOUT_S)
            if hello.get("protocol") != PROTOCOL_VERSION:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"{machine.name} speaks protocol {hello.get('protocol')}, we {PROTOCOL_VERSION}")
            if self.topics:
                await self.call(machine.name, "subscribe", {"topics": self.topics})
            link.state, link.error, link.backoff_s = "online", None, BACKOFF_START_S
            link.online.set()
            await reader_task
        finally:
            reader_task.cancel()

    async def _read(self, link: PeerLink, reader: asyncssh.SSHReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("%s sent a line that is not JSON", link.machine.name)
                continue
            if not isinstance(message, dict):
                continue
            if message.get("event") == EVENT_TICK:
                data = message.get("data")
                changed = data.get("changed") if isinstance(data, dict) else None
                if isinstance(changed, dict):
                    link.sections.update(changed)
                    if self.on_tick is not None:
                        self.on_tick(link.machine.name, changed, bool(data.get("full")))
                continue
            future = link.pending.get(message.get("id"))
            if future is None or future.done():
                continue
            if isinstance(message.get("error"), dict):
                error = message["error"]
                future.set_exception(RemoteError(error.get("code", "internal"), str(error.get("message", "")), error.get("data")))
            else:
                future.set_result(message.get("result"))

    def _drop(self, link: PeerLink) -> None:
        link.online.clear()
        for future in link.pending.values():
            if not future.done():
                future.set_exception(RemoteError(ErrorCode.DISCONNECTED, f"{link.machine.name}: connection lost"))
        link.pending.clear()
        link.writer = None
        for listener, path in link.tunnels.values():
            listener.close()
            Path(path).unlink(missing_ok=True)
        link.tunnels.clear()
        if link.conn is not None:
            link.conn.close()
            link.conn = None
