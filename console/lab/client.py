"""FleetClient: one SSH channel per agent, reconnects, calls and subscriptions. No Textual."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agents.runtime.keys import KeyFileError, check_private
from agents.runtime.link import (
    EventHandler,
    LineReader,
    LineWriter,
    Link,
    LinkCore,
    LinkSettings,
    Transport,
    ssh_error,
)
from agents.runtime.view import SPARK_POINTS
from agents.runtime.waits import within
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab
from agents.wire.protocol import EVENT_TICK, SSH_USERNAME, SUBSYSTEM, ErrorCode, HistoryParams, LinkStatus, RemoteError
from console.lab import openssh
from console.lab.state import LabState

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger("cetlab.client")


BACKOFF_MAX_S = 30.0


def _asyncssh() -> ModuleType:
    """asyncssh, loaded on first use: a CLI verb over OpenSSH never needs it."""
    import asyncssh

    return asyncssh


def _config_dir() -> Path:
    from platformdirs import user_config_path

    return user_config_path("cetlab")


def default_key_path() -> Path:
    return _config_dir() / "id_ed25519"


def default_known_hosts() -> Path:
    return _config_dir() / "known_hosts"


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_has(path: Path, host: str, port: int) -> bool:
    if not path.exists():
        return False
    pattern = host_pattern(host, port)
    return any(
        line.split(None, 1)[0].split(",").count(pattern)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )


class FleetClient:
    """Connects to every machine of a lab at once and keeps a LabState current, on the one client core."""

    def __init__(
        self,
        lab: Lab,
        state: LabState | None = None,
        *,
        key_path: Path | None = None,
        known_hosts: Path | None = None,
        trust_on_first_use: bool | None = None,
        subscribe: list[str] | None = None,
        on_event: EventHandler | None = None,
        reconnect: bool = True,
        use_openssh: bool = False,
    ):
        self.lab = lab
        self.state = state or LabState(lab)
        settings = lab.console
        self.key_path = key_path or lab.resolve(settings.key) or default_key_path()
        self.known_hosts = known_hosts or lab.resolve(settings.known_hosts) or default_known_hosts()
        self.trust_on_first_use = settings.trust_on_first_use if trust_on_first_use is None else trust_on_first_use
        self.keepalive_s = settings.keepalive_s
        self.connect_timeout_s = settings.connect_timeout_s
        self.topics = subscribe if subscribe is not None else [EVENT_TICK]
        self._client_key: asyncssh.SSHKey | None = None
        # one-shot use (the CLI): the system's ssh where it can carry the link, asyncssh otherwise
        self._openssh_argv: dict[str, list[str]] = {}
        if use_openssh and not self.trust_on_first_use:
            for m in lab.machines:
                command = m.via == "agent" and openssh.argv(
                    m.host, m.port, self.key_path, self.known_hosts, self.connect_timeout_s, self.keepalive_s
                )
                if command:
                    self._openssh_argv[m.name] = command
        link_settings = LinkSettings(
            topics=self.topics,
            call_timeout_s=settings.call_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            keepalive_s=self.keepalive_s,
            backoff_max_s=BACKOFF_MAX_S,
            reconnect=reconnect,
        )
        self.core = LinkCore(lab.machines, self, self.state, link_settings, on_event=on_event, on_connected=self._connected)
        self.links = self.core.links

    @property
    def on_event(self) -> EventHandler | None:
        """Called with (machine, event, data) for every event the agents push, data typed (agents/wire/events.py: TickEvent,
        LogEvent, Notice; a tick after it reached the state); an event that does not validate is dropped before."""
        return self.core.on_event

    @on_event.setter
    def on_event(self, handler: EventHandler | None) -> None:
        self.core.on_event = handler

    @property
    def transports(self) -> dict[str, str]:
        """Which SSH client each machine's link uses: openssh or asyncssh."""
        return {name: "openssh" if name in self._openssh_argv else "asyncssh" for name in self.links}

    # -- lifecycle

    async def start(self) -> None:
        key_problem = None
        try:
            check_private(self.key_path)  # like ssh: a private key others can read is not used
            if any(link.machine.via == "agent" and name not in self._openssh_argv for name, link in self.links.items()):
                self._client_key = _asyncssh().read_private_key(self.key_path)
        except ssh_error("KeyImportError", OSError, KeyFileError) as exc:
            key_problem = f"cannot use the console key {self.key_path}: {exc}"
        starting = []
        for name, link in self.links.items():
            if key_problem and link.machine.via == "agent":  # via: sshd uses the user's own ssh keys instead
                self.core.set_status(link, LinkStatus.REFUSED, key_problem)
            else:
                starting.append(name)
        self.core.start(starting)

    async def stop(self) -> None:
        await self.core.stop()

    async def __aenter__(self) -> FleetClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every machine is online or has failed its first attempt (at most `timeout` s)."""
        await self.core.wait_connected(timeout)

    # -- calls

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Call a method on one agent; raises RemoteError (typed) on any failure."""
        return await self.core.call(machine, method, params, timeout)

    async def call_all(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Call every machine; each value is a result or the RemoteError it raised."""
        return await self.core.call_all(method, params, timeout)

    # -- how a link is opened (the core's Opener)

    async def open(self, link: Link) -> Transport:
        machine = link.machine
        if machine.name in self._openssh_argv:
            return await self._through_openssh(link)
        return await (self._through_sshd(link) if machine.via == "sshd" else self._direct(link))

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        """The console's words for a failed attempt: which key to authorize, which host key to check, and how."""
        if isinstance(exc, ssh_error("HostKeyNotVerifiable")):
            return LinkStatus.UNTRUSTED, self._host_key_problem(link.machine, exc)
        if isinstance(exc, ssh_error("PermissionDenied")):
            return LinkStatus.REFUSED, self._key_refused(link.name)
        if isinstance(exc, openssh.SshFailed):  # the OpenSSH client ended: the same statuses and words as above
            if exc.link_status is LinkStatus.UNTRUSTED:
                return LinkStatus.UNTRUSTED, self._host_key_problem(link.machine, exc.message)
            if exc.link_status is LinkStatus.REFUSED:  # a key ssh could not load reads as refused too: ask why
                problem = exc.message[5:] if exc.message.startswith("key: ") else await openssh.key_problem(self.key_path)
                return (
                    LinkStatus.REFUSED,
                    f"cannot use the console key {self.key_path}: {problem}" if problem else self._key_refused(link.name),
                )
            return exc.link_status, exc.message
        return None

    async def _connected(self, link: Link) -> None:
        from agents.wire.catalogue.agent import HISTORY
        from agents.wire.catalogue.method import request  # deferred, as in the core: not on a cold CLI's import path

        name = link.name
        if self.topics:
            self.state.seed_history(name, await request(self, name, HISTORY, HistoryParams(max_points=SPARK_POINTS)))
        else:  # no stream: take one snapshot so the state is not empty
            self.state.apply_status(name, await self.call(name, "status"))

    def _key_refused(self, name: str) -> str:
        return f"the agent refused our key {self.key_path}.pub: authorize it with `cetlab-agent authorize --machine {name} --role operator KEY.pub` on {name}"

    def _host_key_problem(self, machine: Machine, exc: BaseException | str) -> str:
        if machine.via == "sshd":
            return (
                f"the host key of {machine.host} is not trusted by ~/.ssh/known_hosts (or it changed): "
                f"`ssh {machine.host}` once to check and accept it ({exc})"
            )
        where = f"{machine.host}:{machine.port}"
        if known_hosts_has(self.known_hosts, machine.host, machine.port):
            return (
                f"HOST KEY CHANGED for {machine.name} at {where}: refusing to connect. If the agent was "
                f"reinstalled on purpose, remove the line for {host_pattern(machine.host, machine.port)} from {self.known_hosts}"
            )
        return (
            f"unknown host key for {machine.name} at {where}: not in {self.known_hosts}. Add it "
            f"(`cetlab-agent host-key` on the machine) or connect once with --trust-new-hosts"
        )

    async def _trust_new_host(self, machine: Machine) -> None:
        if not self.trust_on_first_use or known_hosts_has(self.known_hosts, machine.host, machine.port):
            return
        asyncssh = _asyncssh()
        key = await within(asyncssh.get_server_host_key(machine.host, machine.port), self.connect_timeout_s)
        if key is None:
            return
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(f"{host_pattern(machine.host, machine.port)} {key.export_public_key().decode().strip()}\n")
        log.warning("trusted the new host key of %s (%s) on first use", machine.name, key.get_fingerprint())

    async def _through_sshd(self, link: Link) -> Transport:
        """via: sshd: the machine's own sshd, as the user's ssh would (keys, agent, known_hosts, ~/.ssh/config with ProxyJump)."""
        asyncssh = _asyncssh()
        machine = link.machine
        config = Path("~/.ssh/config").expanduser()
        conn = await within(
            asyncssh.connect(
                machine.host,
                port=machine.ssh_port or (),
                username=machine.user or (),
                config=[str(config)] if config.exists() else None,
                keepalive_interval=self.keepalive_s,
                keepalive_count_max=2,
            ),
            self.connect_timeout_s,
        )
        path = machine.socket or f"/var/lib/cetlab/{machine.name}/agent.sock"
        try:
            reader, writer = await within(conn.open_unix_connection(path), self.connect_timeout_s)
        except asyncssh.ChannelOpenError as exc:
            conn.close()
            raise RemoteError(
                ErrorCode.DISCONNECTED,
                f"{machine.host}'s sshd cannot open the agent's socket {path}: {exc.reason} "
                f"(is the agent running there, is `socket:` in lab.yaml right, may this user reach it?)",
            ) from None
        except BaseException:
            conn.close()
            raise
        return _over(conn, reader, writer)

    async def _direct(self, link: Link) -> Transport:
        """The agent's own SSH server, with the console's key and known_hosts."""
        asyncssh = _asyncssh()
        machine = link.machine
        await self._trust_new_host(machine)
        conn = await within(
            asyncssh.connect(
                machine.host,
                machine.port,
                username=SSH_USERNAME,
                client_keys=[self._client_key],
                # a missing file means no host is trusted yet (never "trust everything")
                known_hosts=str(self.known_hosts) if self.known_hosts.exists() else asyncssh.import_known_hosts(""),
                agent_path=None,
                config=None,
                keepalive_interval=self.keepalive_s,
                keepalive_count_max=2,
                preferred_auth="publickey",
            ),
            self.connect_timeout_s,
        )
        try:  # bounded too: an agent that authenticates and then freezes must not hold the link
            writer, reader, _stderr = await within(conn.open_session(subsystem=SUBSYSTEM, encoding=None), self.connect_timeout_s)
        except BaseException:
            conn.close()
            raise
        return _over(conn, reader, writer)

    async def _through_openssh(self, link: Link) -> Transport:
        """The agent's own SSH server through the system's ssh: the same key, known_hosts and subsystem."""
        session = await openssh.open_session(self._openssh_argv[link.machine.name])

        async def ended() -> openssh.SshFailed:
            return await session.failure(self.connect_timeout_s)

        return Transport(session.reader, session.writer, session.close, ended=ended)


def _over(conn: asyncssh.SSHClientConnection, reader: LineReader, writer: LineWriter) -> Transport:
    """A channel on an asyncssh connection as the core's transport: closing it closes the connection."""

    async def close() -> None:
        conn.close()

    return Transport(reader, writer, close, conn=conn)
