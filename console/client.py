"""FleetClient: one SSH channel per agent, reconnects, calls and subscriptions. No Textual."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from agents.keys import KeyFileError, check_private
from agents.lab import Lab, Machine
from agents.protocol import EVENT_TICK, MAX_REPLY_BYTES, PROTOCOL_VERSION, SSH_USERNAME, SUBSYSTEM, ErrorCode, RemoteError, encode
from console import openssh
from console.state import SPARK_POINTS, LabState

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger("cetlab.client")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


def _asyncssh():
    """asyncssh, loaded on first use: a CLI verb over OpenSSH never needs it."""
    import asyncssh

    return asyncssh


def _ssh_error(name: str) -> tuple[type, ...]:
    """asyncssh's exception class by name for an `except`, or none where asyncssh was never loaded."""
    module = sys.modules.get("asyncssh")
    return (getattr(module, name),) if module is not None else ()


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
    return any(line.split(None, 1)[0].split(",").count(pattern) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))


@dataclass
class _Link:
    """The live connection to one agent."""

    machine: Machine
    status: str = "connecting"  # connecting | online | offline | refused | untrusted (LabState gets a copy)
    error: str | None = None
    conn: asyncssh.SSHClientConnection | None = None
    ssh: openssh.Session | None = None  # the OpenSSH client process, where the link uses one
    writer: asyncssh.SSHWriter | asyncio.StreamWriter | None = None
    task: asyncio.Task | None = None
    settled: asyncio.Event | None = None  # set once the first attempt is online or has failed
    pending: dict | None = None
    backoff_s: float = BACKOFF_START_S
    last_message: float = 0.0  # monotonic time of the last line from the agent


class FleetClient:
    """Connects to every machine of a lab at once and keeps a LabState current."""

    def __init__(
        self,
        lab: Lab,
        state: LabState | None = None,
        *,
        key_path: Path | None = None,
        known_hosts: Path | None = None,
        trust_on_first_use: bool | None = None,
        subscribe: list[str] | None = None,
        on_event: Callable[[str, str, Any], None] | None = None,
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
        self.call_timeout_s = settings.call_timeout_s
        self.connect_timeout_s = settings.connect_timeout_s
        self.topics = subscribe if subscribe is not None else [EVENT_TICK]
        self.on_event = on_event
        self.reconnect = reconnect
        self._ids = itertools.count(1)
        self._links = {m.name: _Link(m) for m in lab.machines}
        self._client_key: asyncssh.SSHKey | None = None
        self.calls_timed_out = 0
        # one-shot use (the CLI): the system's ssh where it can carry the link, asyncssh otherwise
        self._openssh_argv: dict[str, list[str]] = {}
        if use_openssh and not self.trust_on_first_use:
            for m in lab.machines:
                command = m.via == "agent" and openssh.argv(m.host, m.port, self.key_path, self.known_hosts, self.connect_timeout_s, self.keepalive_s)
                if command:
                    self._openssh_argv[m.name] = command

    @property
    def transports(self) -> dict[str, str]:
        """Which SSH client each machine's link uses: openssh or asyncssh."""
        return {name: "openssh" if name in self._openssh_argv else "asyncssh" for name in self._links}

    # -- lifecycle

    async def start(self) -> None:
        key_problem = None
        try:
            check_private(self.key_path)  # like ssh: a private key others can read is not used
            if any(link.machine.via == "agent" and name not in self._openssh_argv for name, link in self._links.items()):
                self._client_key = _asyncssh().read_private_key(self.key_path)
        except (OSError, KeyFileError, *_ssh_error("KeyImportError")) as exc:
            key_problem = f"cannot use the console key {self.key_path}: {exc}"
        for link in self._links.values():
            if key_problem and link.machine.via == "agent":  # via: sshd uses the user's own ssh keys instead
                self._set_link(link, "refused", key_problem)
                continue
            link.settled = asyncio.Event()
            link.task = asyncio.create_task(self._run(link), name=f"link-{link.machine.name}")

    async def stop(self) -> None:
        for link in self._links.values():
            if link.task:
                link.task.cancel()
            if link.conn:
                link.conn.close()
        await asyncio.gather(*(link.task for link in self._links.values() if link.task), return_exceptions=True)

    async def __aenter__(self) -> FleetClient:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every machine is online or has failed its first attempt (at most `timeout` s)."""
        waits = [asyncio.ensure_future(link.settled.wait()) for link in self._links.values() if link.settled is not None]
        if not waits:
            return
        _done, pending = await asyncio.wait(waits, timeout=timeout)
        for waiting in pending:
            waiting.cancel()

    def _set_link(self, link: _Link, status: str, error: str | None = None) -> None:
        """The link's state is kept here and copied into LabState for the screens and the CLI."""
        link.status, link.error = status, error
        self.state.set_link(link.machine.name, status, error)

    # -- calls

    async def call(self, machine: str, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        """Call a method on one agent; raises RemoteError (typed) on any failure."""
        link = self._links.get(machine)
        if link is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no machine named {machine!r} in the lab")
        if link.writer is None or link.pending is None:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine} is {link.status}" + (f": {link.error}" if link.error else ""))
        request_id = next(self._ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        link.pending[request_id] = future
        try:
            link.writer.write(encode({"id": request_id, "method": method, "params": params or {}}))
            async with asyncio.timeout(timeout or self.call_timeout_s):  # no extra task, unlike wait_for
                return await future
        except asyncio.TimeoutError:
            self.calls_timed_out += 1
            raise RemoteError(ErrorCode.TIMEOUT, f"{machine} did not answer {method} within {timeout or self.call_timeout_s:.0f} s") from None
        except (OSError, *_ssh_error("Error")) as exc:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine}: connection lost ({exc})") from None
        finally:
            if link.pending is not None:
                link.pending.pop(request_id, None)

    async def call_all(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Call every machine; each value is a result or the RemoteError it raised."""
        names = list(self._links)
        results = await asyncio.gather(*(self.call(n, method, params, timeout) for n in names), return_exceptions=True)
        return dict(zip(names, results))

    # -- the connection loop

    async def _run(self, link: _Link) -> None:
        name = link.machine.name
        while True:
            try:
                await self._session(link)
                self._set_link(link, "offline", "the agent closed the connection")
            except _ssh_error("HostKeyNotVerifiable") as exc:
                self._set_link(link, "untrusted", self._host_key_problem(link.machine, exc))
                link.backoff_s = BACKOFF_MAX_S
            except _ssh_error("PermissionDenied"):
                self._set_link(link, "refused", self._key_refused(name))
                link.backoff_s = BACKOFF_MAX_S
            except openssh.SshFailed as exc:  # the OpenSSH client ended: the same statuses and words as above
                if exc.link_status == "untrusted":
                    self._set_link(link, "untrusted", self._host_key_problem(link.machine, exc.message))
                elif exc.link_status == "refused":  # a key ssh could not load reads as refused too: ask why
                    problem = exc.message[5:] if exc.message.startswith("key: ") else await openssh.key_problem(self.key_path)
                    self._set_link(link, "refused", f"cannot use the console key {self.key_path}: {problem}" if problem else self._key_refused(name))
                else:
                    self._set_link(link, "offline", exc.message)
                if exc.link_status != "offline":
                    link.backoff_s = BACKOFF_MAX_S
            except RemoteError as exc:
                refused = exc.code == ErrorCode.FORBIDDEN  # e.g. a socket user without a role: retrying will not help
                self._set_link(link, "refused" if refused else "offline", exc.message)
                if refused:
                    link.backoff_s = BACKOFF_MAX_S
            except (OSError, asyncio.TimeoutError, ConnectionError, *_ssh_error("Error")) as exc:
                self._set_link(link, "offline", _describe(exc))
            finally:
                self._drop(link)
                if link.ssh is not None:
                    session, link.ssh = link.ssh, None
                    await session.close()
            if link.settled is not None:
                link.settled.set()
            if not self.reconnect:
                return
            delay = link.backoff_s * (0.8 + 0.4 * random.random())
            link.backoff_s = min(BACKOFF_MAX_S, link.backoff_s * 2)
            await asyncio.sleep(delay)

    def _key_refused(self, name: str) -> str:
        return f"the agent refused our key {self.key_path}.pub: authorize it with `cetlab-agent authorize --machine {name} --role operator KEY.pub` on {name}"

    def _host_key_problem(self, machine: Machine, exc: Exception | str) -> str:
        if machine.via == "sshd":
            return (f"the host key of {machine.host} is not trusted by ~/.ssh/known_hosts (or it changed): "
                    f"`ssh {machine.host}` once to check and accept it ({exc})")
        where = f"{machine.host}:{machine.port}"
        if known_hosts_has(self.known_hosts, machine.host, machine.port):
            return (f"HOST KEY CHANGED for {machine.name} at {where}: refusing to connect. If the agent was "
                    f"reinstalled on purpose, remove the line for {host_pattern(machine.host, machine.port)} from {self.known_hosts}")
        return (f"unknown host key for {machine.name} at {where}: not in {self.known_hosts}. Add it "
                f"(`cetlab-agent host-key` on the machine) or connect once with --trust-new-hosts")

    async def _trust_new_host(self, machine: Machine) -> None:
        if not self.trust_on_first_use or known_hosts_has(self.known_hosts, machine.host, machine.port):
            return
        asyncssh = _asyncssh()
        key = await asyncio.wait_for(asyncssh.get_server_host_key(machine.host, machine.port), self.connect_timeout_s)
        if key is None:
            return
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(f"{host_pattern(machine.host, machine.port)} {key.export_public_key().decode().strip()}\n")
        log.warning("trusted the new host key of %s (%s) on first use", machine.name, key.get_fingerprint())

    async def _through_sshd(self, link: _Link) -> tuple[asyncssh.SSHReader, asyncssh.SSHWriter]:
        """via: sshd: the machine's own sshd, as the user's ssh would (keys, agent, known_hosts, ~/.ssh/config with ProxyJump)."""
        asyncssh = _asyncssh()
        machine = link.machine
        config = Path("~/.ssh/config").expanduser()
        link.conn = await asyncio.wait_for(
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
            return await asyncio.wait_for(link.conn.open_unix_connection(path), self.connect_timeout_s)
        except asyncssh.ChannelOpenError as exc:
            raise RemoteError(ErrorCode.DISCONNECTED, f"{machine.host}'s sshd cannot open the agent's socket {path}: {exc.reason} "
                              f"(is the agent running there, is `socket:` in lab.yaml right, may this user reach it?)") from None

    async def _direct(self, link: _Link) -> tuple[asyncssh.SSHReader, asyncssh.SSHWriter]:
        """The agent's own SSH server, with the console's key and known_hosts."""
        asyncssh = _asyncssh()
        machine = link.machine
        await self._trust_new_host(machine)
        link.conn = await asyncio.wait_for(
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
        # bounded too: an agent that authenticates and then freezes must not hold the link
        writer, reader, _stderr = await asyncio.wait_for(link.conn.open_session(subsystem=SUBSYSTEM, encoding=None), self.connect_timeout_s)
        return reader, writer

    async def _through_openssh(self, link: _Link) -> tuple[openssh.PipeReader, asyncio.StreamWriter]:
        """The agent's own SSH server through the system's ssh: the same key, known_hosts and subsystem."""
        link.ssh = await openssh.open_session(self._openssh_argv[link.machine.name])
        return link.ssh.reader, link.ssh.writer

    async def _session(self, link: _Link) -> None:
        machine = link.machine
        if machine.name in self._openssh_argv:
            reader, writer = await self._through_openssh(link)
        else:
            reader, writer = await (self._through_sshd(link) if machine.via == "sshd" else self._direct(link))
        link.writer, link.pending = writer, {}
        reader_task = asyncio.create_task(self._read(link, reader))
        try:
            hello = await self.call(machine.name, "hello", timeout=self.connect_timeout_s)
            if hello.get("protocol") != PROTOCOL_VERSION:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"agent speaks protocol {hello.get('protocol')}, this console {PROTOCOL_VERSION}: upgrade one of them")
            if hello.get("machine") != machine.name:  # another agent at this address (a taken port or socket)
                raise RemoteError(ErrorCode.UNAVAILABLE, f"the agent at {machine.host} answers as machine {hello.get('machine')!r}, "
                                  f"not {machine.name!r}: check host, port and socket in lab.yaml; refusing it")
            self.state.set_hello(machine.name, hello)
            if self.topics:
                self.state.seed_history(machine.name, await self.call(machine.name, "history", {"max_points": SPARK_POINTS}))
                await self.call(machine.name, "subscribe", {"topics": self.topics})
            else:  # no stream: take one snapshot so the state is not empty
                self.state.apply_status(machine.name, await self.call(machine.name, "status"))
            self._set_link(link, "online")
            link.backoff_s = BACKOFF_START_S
            if link.settled is not None:
                link.settled.set()
            await self._watch(link, reader_task, hello.get("sample_interval_s", 1.0))
        finally:
            reader_task.cancel()
            if reader_task.done() and not reader_task.cancelled():
                reader_task.exception()  # raised to the waiting call already; retrieved here, not logged as lost

    async def _watch(self, link: _Link, reader_task: asyncio.Task, interval_s: float) -> None:
        """Return when the stream ends or goes silent (faster than SSH keepalives notice)."""
        silent_after = max(3 * interval_s + 2.0, self.keepalive_s * 2)
        while not reader_task.done():
            await asyncio.wait({reader_task}, timeout=1.0)
            silent_s = time.monotonic() - link.last_message
            if self.topics and silent_s > silent_after:
                # the threshold, not a count: the card's "last seen ... ago" is the one figure that moves
                raise RemoteError(ErrorCode.DISCONNECTED, f"went silent: no data within {silent_after:.0f} s")
        reader_task.result()

    async def _read(self, link: _Link, reader: asyncssh.SSHReader | openssh.PipeReader) -> None:
        name = link.machine.name
        while True:
            line = await read_line(reader)
            if line is None:
                if link.ssh is not None:  # ssh ended: say why, to the calls waiting too (the first is `hello`)
                    failure = await link.ssh.failure(self.connect_timeout_s)
                    self._fail_pending(link, failure)
                    raise failure
                return
            link.last_message = time.monotonic()
            if not line:  # longer than any reply may be: dropped whole
                log.warning("%s sent a line longer than %d bytes; dropped", name, MAX_REPLY_BYTES)
                continue
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("%s sent a line that is not JSON", name)
                continue
            if "event" in message:
                event, data = message["event"], message.get("data")
                if event == EVENT_TICK:
                    self.state.apply_tick(name, data)
                if self.on_event is not None:
                    self.on_event(name, event, data)
                continue
            future = link.pending.get(message.get("id")) if link.pending is not None else None
            if future is None or future.done():
                error = message.get("error") or {}
                if error:
                    log.warning("%s: %s", name, error.get("message"))
                if error.get("code") == ErrorCode.FORBIDDEN and message.get("id") is None:  # refused at the door (unix socket)
                    for waiting in (link.pending or {}).values():
                        if not waiting.done():
                            waiting.set_exception(RemoteError(ErrorCode.FORBIDDEN, error.get("message", "")))
                continue
            if "error" in message:
                error = message["error"]
                future.set_exception(RemoteError(error.get("code", "internal"), error.get("message", ""), error.get("data")))
            else:
                future.set_result(message.get("result"))

    def _fail_pending(self, link: _Link, exc: Exception) -> None:
        for future in (link.pending or {}).values():
            if not future.done():
                future.set_exception(exc)

    def _drop(self, link: _Link) -> None:
        self._fail_pending(link, RemoteError(ErrorCode.DISCONNECTED, f"{link.machine.name}: connection lost"))
        link.pending, link.writer = None, None
        if link.conn is not None:
            link.conn.close()
            link.conn = None


async def read_line(reader: asyncssh.SSHReader | openssh.PipeReader, limit: int = MAX_REPLY_BYTES) -> bytes | None:
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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer (timed out)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the agent running?)"
    if isinstance(exc, _ssh_error("DisconnectError")):
        return f"disconnected: {exc.reason}"
    return str(exc) or type(exc).__name__
