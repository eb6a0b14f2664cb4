"""The agent: samples its machine at a fixed rate, keeps history, serves and pushes it."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel

from agents.runtime.bus import Bus
from agents.runtime.core import ComponentFactory
from agents.runtime.history import History
from agents.runtime.keys import (
    AUTHORIZED_KEYS_NAME,
    HOST_KEY_NAME,
    PUSHED_AUTHORIZED_KEYS_NAME,
    AuthorizedKeys,
    StateDirError,
    ensure_key,
    prepare_state_dir,
)
from agents.runtime.labfile import running_lab
from agents.runtime.principals import Principals
from agents.runtime.rpc import Peer, Registry
from agents.runtime.stopping import stop_within
from agents.runtime.store import Store
from agents.shell.components import default_components
from agents.shell.core_methods import register_core
from agents.telemetry.host import HostSampler
from agents.telemetry.samplers import GpuSampler, open_gpu_sampler
from agents.wire.events import PushEvent, TickEvent
from agents.wire.lab.model import Lab
from agents.wire.protocol import (
    EVENT_TICK,
    GpuSample,
    Telemetry,
)
from agents.wire.sections.base import FaultsSection, GpuStatus, SectionFault
from agents.wire.sections.gateway import GatewaySection
from agents.wire.sections.lab import LabSection
from agents.wire.sections.models import ModelsSection
from agents.wire.sections.tick import Tick

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger("cetlab.agent")
T = TypeVar("T")
E = TypeVar("E")

SOCKET_NAME = "agent.sock"
PID_FILE_NAME = "agent.pid"


class Component(Protocol):
    """A part of the agent (jobs, orchestra, checkpoints, costs, alerts, audit) plugged into its loop: start, stop,
    its section, and the hooks every component declares by taking agents/runtime/hooks.py's ``Hooks`` (the tick's two
    phases, the prefetch, how long its stop may take)."""

    name: str
    reads_tick: ClassVar[bool]
    stop_grace_s: ClassVar[float]

    async def prefetch(self) -> None: ...

    def on_telemetry(self, telemetry: Telemetry) -> None: ...

    def on_tick(self, tick: Tick) -> None: ...

    async def start(self) -> None: ...  # built with its AgentCore; start() opens what it needs

    async def stop(self) -> None: ...

    def section(self) -> Any: ...  # its typed section (agents/wire/sections/), pushed under `name` when it changes


def wire(value: Any) -> Any:
    """A typed section (a model, a list of models, or None) as JSON."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [wire(item) for item in value]
    return value


def gpus_said(backend: str, status: str | None) -> str:
    """The GPUs in the agent's start line: "nvml GPUs: ok", or why there are none (never "none GPUs")."""
    if backend == "none" or (status or "").startswith("no "):  # "no NVIDIA GPUs: <reason>" says it already
        return status or "no GPUs"
    return f"{backend} GPUs: {status or 'ok'}"


class Agent:
    def __init__(
        self,
        lab: Lab,
        machine: str,
        state_dir: Path,
        listen: tuple[str, int] | None = None,
        gpu_sampler: GpuSampler | None = None,
        components: ComponentFactory | None = None,
        unix_socket: Path | None = None,
        keep_engines: bool = False,
    ):
        from agents.orchestra.engines import ENGINES

        # the copy `cetlab lab push` left in the state dir wins over --lab (agents/runtime/labfile.py)
        self.running = running_lab(lab, machine, state_dir, ENGINES)
        self.started_lab = self.lab = self.running.lab  # started_lab: what was bound at start (port, GPUs, gateway)
        self.machine = self.lab.machine(machine)
        self.lab_section = LabSection(version=self.running.version, source=self.running.source)
        self.state_dir = state_dir
        self.listen_addr = listen or (self.machine.host, self.machine.port)
        # via: sshd consoles come through the machine's sshd to the socket: no SSH port of our own unless asked
        self.serves_tcp = listen is not None or self.machine.via == "agent"
        self.unix_socket = unix_socket or state_dir / SOCKET_NAME  # for `via: sshd`
        self.keep_engines = keep_engines  # model servers outlive this agent (systemd); the next one re-adopts them
        self.pid_file = state_dir / PID_FILE_NAME  # locked while this agent runs; engines follow its pid
        self._pid_fd: int | None = None
        self._unix_server: asyncio.AbstractServer | None = None
        self.interval_s = self.machine.sample_interval_s
        self.gpus = gpu_sampler or open_gpu_sampler(self.machine)
        self.host = HostSampler(str(state_dir))
        self.history = History(self.interval_s)
        self.rpc = Registry()
        self.bus = Bus()  # the components' news for one another (AgentCore.publish)
        self.peers: set[Peer] = set()
        self.principals = Principals()  # what each key or socket uid holds and spends, over every transport
        self.components: list[Component] = []
        self._found: dict[object, object] = {}  # find()'s answers, for the list of components they were found in
        self._found_in: tuple[int, int] | None = None
        self.latest: Telemetry | None = None
        self.started_at = time.time()
        self._store: Store | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.current: dict[str, Any] = {}  # the typed sections of the latest tick, by name (agents/wire/sections/)
        self._last_sections: dict[str, Any] = {}
        self.faults: dict[str, SectionFault] = {}  # the sections whose component raised in the latest tick
        self._last_gpus: dict[int, dict[str, Any]] = {}
        self.ticks = 0
        register_core(self)  # the core's methods first (`methods` lists them first)
        # Last, on a whole core: the components are built with this agent as their AgentCore.
        self.components = list(default_components(self) if components is None else components(self))

    @property
    def simulated(self) -> bool:
        return self.gpus.simulated

    @property
    def store(self) -> Store:
        """The machine's SQLite state, open from start() on."""
        if self._store is None:
            raise RuntimeError("the agent's store is opened by start()")
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = store

    def find(self, port: Callable[..., T]) -> T | None:
        """The component that provides this port (a runtime-checkable Protocol or a class), None where none runs."""
        components = self.components
        if self._found_in != (id(components), len(components)):  # looked up once per list of components: an
            self._found, self._found_in = {}, (id(components), len(components))  # isinstance of a Protocol is slow
        if port not in self._found:
            kind = cast("type[T]", port)  # a class; typed as a callable so that mypy takes a Protocol (AgentCore.find)
            self._found[port] = next((c for c in components if isinstance(c, kind)), None)
        return cast("T | None", self._found[port])

    def publish(self, event: object) -> None:
        self.bus.publish(event)

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        self.bus.subscribe(kind, handler)

    # -- lifecycle

    async def start(self) -> None:
        from agents.shell import channel

        prepare_state_dir(self.state_dir)
        self._lock_state_dir()
        if self.serves_tcp:  # the SSH server's keys; a `via: sshd` agent has no SSH server, and never loads asyncssh (issue 22)
            host_key = ensure_key(self.state_dir / HOST_KEY_NAME, comment=f"cetlab-agent@{self.machine.name}")
            authorized = AuthorizedKeys(self.state_dir / AUTHORIZED_KEYS_NAME, self.state_dir / PUSHED_AUTHORIZED_KEYS_NAME)
            authorized.entries()  # refuse a malformed or too-open file now, not at the first login
        self.store = Store(self.state_dir / "state.db")
        await self.start_components()
        self.tick()  # a first sample before anyone connects
        self._loop_task = asyncio.create_task(self._run_loop(), name="telemetry")
        if self.serves_tcp:
            from agents.shell import server

            self._acceptor = await server.listen(self, self.listen_addr[0], self.listen_addr[1], host_key, authorized)
        self._unix_server = await channel.listen_unix(self, self.unix_socket)
        log.info(
            "agent for %s listening on %s (%s)",
            self.machine.name,
            " and ".join(
                where
                for where, up in (
                    ("{}:{}".format(*self.listen_addr), self.serves_tcp),
                    (str(self.unix_socket), self._unix_server),
                )
                if up
            ),
            gpus_said(self.gpus.backend, self.gpus.status),
        )

    async def start_components(self) -> None:
        """Start every component, in order, on the open store (start() does it; tests that serve no SSH call it alone)."""
        for component in self.components:
            await component.start()

    def _lock_state_dir(self) -> None:
        """One agent per state dir: a second one would fight over jobs, engines and the socket."""
        fd = os.open(self.pid_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise StateDirError(f"another agent (pid {other or '?'}) is using {self.state_dir}; stop it first") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._pid_fd = fd

    @property
    def bound_port(self) -> int:
        return self._acceptor.sockets[0].getsockname()[1] if self._acceptor else self.listen_addr[1]

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        if self._unix_server is not None:
            self._unix_server.close()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await stop_within("the telemetry loop", asyncio.gather(self._loop_task, return_exceptions=True))
        for component in reversed(self.components):  # each within its deadline: one that holds is logged, not waited on
            await stop_within(component.name, component.stop(), component.stop_grace_s)
        self.gpus.close()
        if self._store is not None:
            self._store.close()
        if self._pid_fd is not None:
            os.close(self._pid_fd)  # releases the lock
            self._pid_fd = None

    # -- sampling

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if loop.time() - next_at > self.interval_s:  # fell behind (suspend, overload): skip, don't burst
                next_at = loop.time()
            for component in self.components:  # files from outside (a trainer's progress) read off the loop first
                try:
                    await component.prefetch()
                except Exception:
                    log.exception("%s.prefetch failed", component.name)
            try:
                if self.gpus.backend == "nvml":
                    gpus = await asyncio.to_thread(self.gpus.sample)
                    self.tick(gpus)
                else:
                    self.tick()
            except Exception:
                log.exception("tick failed")

    def tick(self, gpus: list[GpuSample] | None = None) -> None:
        """One tick: sample, let the state owners update, then the readers see that same tick, then push the diff.

        Public so tests drive the agent deterministically (one call, one tick) instead of waiting on the timer;
        ``gpus``: samples to use instead of the sampler's."""
        telemetry = Telemetry(
            machine=self.machine.name,
            t=time.time(),
            gpus=gpus if gpus is not None else self.gpus.sample(),
            host=self.host.sample(),
            gpu_backend=self.gpus.backend,
            gpu_status=self.gpus.status,
            simulated=self.gpus.simulated,
        )
        self.latest = telemetry
        self.history.add(telemetry)
        self.ticks += 1
        failing: dict[str, SectionFault] = {}  # this tick's faults, by section: consoles are told (the `faults` section)
        for component in self.components:  # phase one: the owners of state update
            try:
                component.on_telemetry(telemetry)
            except Exception as exc:
                self._failed(failing, component.name, "update", exc)
        owned = self._sections((c for c in self.components if not c.reads_tick), failing)
        models = owned.get("models")
        gateway = owned.get("gateway")
        tick = Tick(
            telemetry,
            owned.get("jobs") or [],
            models if isinstance(models, ModelsSection) else None,
            gateway if isinstance(gateway, GatewaySection) else None,
        )
        for component in self.components:  # phase two: the readers see this same tick
            if component.reads_tick:
                try:
                    component.on_tick(tick)
                except Exception as exc:
                    self._failed(failing, component.name, "read", exc)
        read = self._sections((c for c in self.components if c.reads_tick), failing)
        for name in self.faults.keys() - failing.keys():
            log.warning(
                "%s recovered (it failed since %s)", name, time.strftime("%H:%M:%S", time.localtime(self.faults[name].since))
            )
        self.faults = failing
        self.current = {**self._machine_sections(telemetry), **owned, **read}
        self._broadcast(telemetry)

    def _machine_sections(self, t: Telemetry) -> dict[str, Any]:
        return {
            "host": t.host,
            "gpu_status": GpuStatus(backend=t.gpu_backend, status=t.gpu_status, simulated=t.simulated),
            "faults": FaultsSection(failed=sorted(self.faults.values(), key=lambda f: f.section)),
            "lab": self.lab_section,
        }

    def _failed(
        self, failing: dict[str, SectionFault], name: str, phase: Literal["update", "read", "section"], exc: Exception
    ) -> None:
        """Note that a component raised: its section shows as failed on every console until a tick goes through clean."""
        if name in failing:
            return  # the first error of the tick says what went wrong
        error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        before = self.faults.get(name)
        if before is None or before.error != error:  # logged once per new error, not at every tick
            log.error("%s failed (%s): %s", name, phase, error, exc_info=exc)
        failing[name] = SectionFault(
            section=name, phase=phase, error=error, since=before.since if before is not None else time.time()
        )

    def _sections(self, components: Iterable[Component], failing: dict[str, SectionFault] | None = None) -> dict[str, Any]:
        """The typed sections of these components; one that fails is left out (noted in `failing`), the rest go on."""
        sections: dict[str, Any] = {}
        for component in components:
            try:
                sections[component.name] = component.section()
            except Exception as exc:
                if failing is not None:
                    self._failed(failing, component.name, "section", exc)
                else:
                    log.exception("%s.section failed", component.name)
        return sections

    def sections(self) -> dict[str, Any]:
        """The whole state, by section, as JSON, as it is now (between ticks too: `status` answers with it)."""
        current = {**(self._machine_sections(self.latest) if self.latest else {}), **self._sections(self.components)}
        return {name: wire(value) for name, value in current.items()}

    def _broadcast(self, telemetry: Telemetry) -> None:
        sections = {name: wire(value) for name, value in self.current.items()}
        gpus = {g.index: g.model_dump(mode="json") for g in telemetry.gpus}
        changed = {k: v for k, v in sections.items() if self._last_sections.get(k) != v}
        changed_gpus = [g for i, g in gpus.items() if self._last_gpus.get(i) != g]
        self._last_sections, self._last_gpus = sections, gpus
        whole: dict[str, Any] | None = None  # built once a tick, for the consoles that just subscribed
        diff: dict[str, Any] | None = None
        for peer in list(self.peers):
            if EVENT_TICK not in peer.topics:
                continue
            if peer.wants_full:
                peer.wants_full = False
                if whole is None:
                    whole = TickEvent(t=telemetry.t, full=True, changed={**sections, "gpus": list(gpus.values())}).to_wire()
                peer.push(EVENT_TICK, whole)
            else:
                if diff is None:
                    diff = TickEvent(t=telemetry.t, full=False, changed={**changed, "gpus": changed_gpus}).to_wire()
                peer.push(EVENT_TICK, diff)

    def claim_gpus(self, indices: list[int], key: str, owner: str, mem_bytes: int, util_pct: float, pid: int = 0) -> None:
        """Tell a simulated backend what now runs on these GPUs (NVML sees real processes itself)."""
        claim = getattr(self.gpus, "claim", None)
        if claim is None:
            return
        from agents.telemetry.sim import Claim

        for index in indices:
            claim(index, key, Claim(owner=owner, mem_bytes=mem_bytes, util_pct=util_pct, pid=pid))

    def release_gpus(self, key: str) -> None:
        release = getattr(self.gpus, "release", None)
        if release is not None:
            release(key)

    def notify(self, event: PushEvent) -> None:
        """Push an event to every subscriber of its topic."""
        data = event.to_wire()
        for peer in list(self.peers):
            if event.event in peer.topics:
                peer.push(event.event, data)  # never raises: a NaN goes out as null, an unencodable event is logged
