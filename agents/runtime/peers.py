"""Agent-to-agent client: one SSH channel per peer agent, verified host keys, calls and tick sections."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import asyncssh

from agents.runtime.keys import ensure_key
from agents.runtime.link import Link, LinkCore, LinkSettings, Transport
from agents.runtime.peer_links import BACKOFF_MAX_S, CALL_TIMEOUT_S, CONNECT_TIMEOUT_S, KEEPALIVE_S, PeerLinkState
from agents.runtime.view import LabView, MachineView
from agents.runtime.waits import within
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import Lab
from agents.wire.protocol import EVENT_TICK, SSH_USERNAME, SUBSYSTEM, ErrorCode, LinkStatus, RemoteError

log = logging.getLogger("cetlab.peers")

PEER_KEY_NAME = "peer_ed25519_key"  # this agent's client key; authorize its .pub on the peers (with the least role that works)
PEER_KNOWN_HOSTS_NAME = "peer_known_hosts"  # the peers' host keys; never trusted on first use
SCHEDULER_KEY_NAME = "scheduler_ed25519_key"  # the lab queue's calls to start and stop its jobs: the scheduler role
NODE_KEY_NAME = "node_ed25519_key"  # the key a multi-node job's coordinator calls the other nodes with (role node there)

TUNNEL_BACKLOG = 2048  # as the engines' own (uvicorn's): a burst of streams queues, never refused (asyncssh's listener: 100)
TUNNEL_CHUNK_BYTES = 256 * 1024


async def _forward(conn: asyncssh.SSHClientConnection, path: str, target: EngineAddress) -> asyncio.Server:
    """Listen on the unix socket ``path``; each connection becomes a channel to the engine at ``target`` on the far side
    of ``conn`` (direct-streamlocal to its socket, or direct-tcpip to 127.0.0.1:PORT where lab.yaml put it on a port),
    bytes copied both ways as they come (half-closes passed on)."""

    async def copy(
        source: asyncio.StreamReader | asyncssh.SSHReader[bytes], sink: asyncio.StreamWriter | asyncssh.SSHWriter[bytes]
    ) -> None:
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
            if target.socket is not None:
                far_reader, far_writer = await conn.open_unix_connection(target.socket, encoding=None)
            else:
                far_reader, far_writer = await conn.open_connection("127.0.0.1", target.port, encoding=None)
        except (OSError, asyncssh.Error) as exc:
            log.warning("forward to %s refused: %s", target, exc)
            writer.close()
            return
        try:
            await asyncio.gather(copy(reader, far_writer), copy(far_reader, writer))
        finally:
            far_writer.close()
            writer.close()

    return await asyncio.start_unix_server(handle, path, backlog=TUNNEL_BACKLOG, limit=TUNNEL_CHUNK_BYTES)


class PeerClient:
    """Connects this agent to the other agents of the lab (and to itself), as an SSH client, on the one client core.

    The key is ``<state>/peer_ed25519_key`` (made on first use); host keys are checked against
    ``<state>/peer_known_hosts``. Ticks of the ``topics`` asked for keep each machine's typed view
    (``view(machine)``: its link status and models); ``call`` runs a method on one peer, with typed errors.
    """

    def __init__(
        self,
        lab: Lab,
        state_dir: Path,
        machines: list[str] | None = None,
        topics: list[str] | None = None,
        key_name: str = PEER_KEY_NAME,
    ):
        self.lab = lab
        self.key_path = state_dir / key_name
        self.known_hosts = state_dir / PEER_KNOWN_HOSTS_NAME
        wanted = machines if machines is not None else [m.name for m in lab.machines]
        self.views = LabView(lab, wanted)
        settings = LinkSettings(
            topics=topics if topics is not None else [EVENT_TICK],
            call_timeout_s=CALL_TIMEOUT_S,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            keepalive_s=KEEPALIVE_S,
            backoff_max_s=BACKOFF_MAX_S,
        )
        self.core = LinkCore([lab.machine(name) for name in wanted], self, self.views, settings)
        self.links = self.core.links
        self._key: asyncssh.SSHKey | None = None
        self._tunnel_dir: Path | None = None
        self._tunnels: dict[str, dict[EngineAddress, tuple[asyncio.Server, str]]] = {
            name: {} for name in wanted
        }  # peer's engine address -> (forward, its socket here)
        self._tunnel_locks = {name: asyncio.Lock() for name in wanted}
        self._tcp_forwards: dict[str, dict[int, asyncssh.SSHListener]] = {name: {} for name in wanted}  # far port -> here

    def view(self, machine: str) -> MachineView:
        """What this agent knows of a peer: its link status and its last tick's typed sections."""
        return self.views.machines[machine]

    def link_states(self, purpose: str, role: str) -> list[PeerLinkState]:
        return [
            PeerLinkState(purpose, name, link.status, link.error, self.key_path, self.known_hosts, role)
            for name, link in self.links.items()
        ]

    async def start(self) -> None:
        self._key = ensure_key(self.key_path, comment="cetlab-peer")
        self.core.start()

    async def stop(self) -> None:
        await self.core.stop()
        if self._tunnel_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._tunnel_dir, True)

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Call a method on one peer; raises RemoteError (DISCONNECTED, TIMEOUT or the peer's own)."""
        return await self.core.call(machine, method, params, timeout)

    async def tunnel(self, machine: str, target: EngineAddress) -> str:
        """A unix socket on this machine that reaches the engine at ``target`` on ``machine`` through our SSH connection
        to its agent (a direct-streamlocal forward per connection, direct-tcpip for an engine on a port; that agent
        allows them to its engines' sockets and ports only, for the gateway's key only). The socket is in a folder only this agent's user can enter: no other local user
        reaches a remote engine through it. Raises RemoteError(DISCONNECTED) while the peer is not connected."""
        link = self.links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no peer named {machine!r}")
        async with self._tunnel_locks[machine]:
            tunnels = self._tunnels[machine]
            found = tunnels.get(target)
            if found is not None:
                return found[1]
            if link.conn is None:
                raise link.unavailable()
            if self._tunnel_dir is None:  # short, private (0700), and gone with the agent; sun_path holds 107 bytes
                self._tunnel_dir = Path(tempfile.mkdtemp(prefix="cetlab-tunnels-"))
            digest = hashlib.sha256(target.endpoint.encode()).hexdigest()[:16]  # a far path can be long; sun_path is not
            path = str(self._tunnel_dir / f"{machine}-{digest}.sock")
            Path(path).unlink(missing_ok=True)
            try:
                listener = await _forward(link.conn, path, target)
            except OSError as exc:
                raise RemoteError(
                    ErrorCode.DISCONNECTED, f"{machine}: cannot forward to its engine at {target} ({exc})"
                ) from None
            tunnels[target] = (listener, path)
            return path

    async def tcp_forward(self, machine: str, port: int) -> int:
        """A port on this machine's 127.0.0.1 whose connections go, through our SSH connection to ``machine``'s agent
        (direct-tcpip), to that machine's 127.0.0.1:``port`` (an rpc-server it runs for us: its agent allows that port
        only, and counts each connection in our key's forwards). For a program that reaches its peer by host:port only
        (llama-server's --rpc); gone with the link. Raises RemoteError(DISCONNECTED) while the peer is not connected."""
        link = self.links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no peer named {machine!r}")
        async with self._tunnel_locks[machine]:
            found = self._tcp_forwards[machine].get(port)
            if found is not None:
                return found.get_port()
            if link.conn is None:
                raise link.unavailable()
            try:
                listener = await link.conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", port)
            except (OSError, asyncssh.Error) as exc:
                raise RemoteError(ErrorCode.DISCONNECTED, f"{machine}: cannot forward to its port {port} ({exc})") from None
            self._tcp_forwards[machine][port] = listener
            return listener.get_port()

    def drop_tcp_forward(self, machine: str, port: int) -> None:
        """Close the forward to ``machine``'s port (its rpc-server stopped)."""
        listener = self._tcp_forwards.get(machine, {}).pop(port, None)
        if listener is not None:
            listener.close()

    # -- how a link is opened (the core's Opener)

    async def open(self, link: Link) -> Transport:
        machine = link.machine
        conn = await within(
            asyncssh.connect(
                machine.host,
                machine.port,
                username=SSH_USERNAME,
                client_keys=[self._key],
                known_hosts=str(self.known_hosts) if self.known_hosts.exists() else asyncssh.import_known_hosts(""),
                agent_path=None,
                config=None,
                keepalive_interval=KEEPALIVE_S,
                keepalive_count_max=3,
                preferred_auth="publickey",
            ),
            CONNECT_TIMEOUT_S,
        )
        try:
            writer, reader, _ = await within(conn.open_session(subsystem=SUBSYSTEM, encoding=None), CONNECT_TIMEOUT_S)
        except BaseException:
            conn.close()
            raise

        async def close() -> None:  # the link's forwards go with it
            for listener, path in self._tunnels[link.name].values():
                listener.close()
                Path(path).unlink(missing_ok=True)
            self._tunnels[link.name].clear()
            for forward in self._tcp_forwards[link.name].values():
                forward.close()
            self._tcp_forwards[link.name].clear()
            conn.close()

        return Transport(reader, writer, close, conn=conn)

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        """A peer's host key is never trusted on first use; its refusal names the key to authorize."""
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            return LinkStatus.UNTRUSTED, f"host key of {link.name} not in {self.known_hosts} (or changed): {exc}"
        if isinstance(exc, asyncssh.PermissionDenied):
            return LinkStatus.REFUSED, f"{link.name} refused our key {self.key_path}.pub: authorize it there"
        return None
