"""One llama.cpp model over several machines: llama.cpp's rpc-server on the helper machines, llama-server on the model's.

A model whose lab.yaml entry says ``rpc: [{machine, gpus}]`` is served by llama-server on its own machine with
``--rpc 127.0.0.1:P1,...``: each P is a port on that machine's loopback forwarded (direct-tcpip) through the model
agent's SSH link to a helper's agent, which runs rpc-server for the model on its own 127.0.0.1 (rpc-server has no
authentication: it never listens on the network). The model's agent calls the helpers with its node key (role node
there, which may call models.rpc_* and forward to the ports of the rpc-servers that agent runs, nothing else).

Bring-up: every helper's rpc-server first (each answers once it listens), then llama-server. Placement sums the
machines' GPU memory: the model's need (vram_gib, else its GGUF's estimate) is split over its own GPUs and the helpers' by each GPU's memory, and each
machine checks its share. Stopping the model stops its rpc-servers; a helper whose rpc-server ends, or whose agent
stops answering, fails the model with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from agents.orchestra.engine import free_port
from agents.orchestra.engines import engine_spec
from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.slot import EngineFailed, Slot, gib_text
from agents.runtime.children import minimal_env
from agents.runtime.core import AgentCore
from agents.runtime.procfiles import LOG_KEEP, LOG_MAX_BYTES, copy_truncate
from agents.runtime.waits import within
from agents.wire.catalogue.method import Method, P, R, ReplyInvalid, request
from agents.wire.catalogue.spread import (
    MODELS_RPC_START,
    MODELS_RPC_STATUS,
    MODELS_RPC_STOP,
    RPC_ERROR_CHARS,
    RPC_LAST_LINES,
    RPC_LINE_CHARS,
    RpcGpu,
    RpcParams,
    RpcServerStatus,
    RpcStartParams,
    RpcState,
)
from agents.wire.lab.model import Model
from agents.wire.lab.spread import RpcHelper
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.states import MODEL_ENGINE_UP

if TYPE_CHECKING:
    from agents.orchestra.placement import Placement
    from agents.runtime.peers import PeerClient
    from agents.runtime.rpc import Peer

log = logging.getLogger("cetlab.orchestra")

LISTEN_WAIT_S = 30.0  # rpc-server binds its port at once; a CUDA build first makes a context on each GPU (seconds)
BIND_TRIES = 3  # ports tried when another process takes the chosen one before rpc-server binds it
STOP_GRACE_S = 5.0
WATCH_S = 1.0  # how often the model's agent asks its helpers how their rpc-servers are
START_TIMEOUT_S = LISTEN_WAIT_S * BIND_TRIES + 10.0
LINK_WAIT_S = 30.0  # a bring-up waits this long for a helper's link (the lab's agents start together; SSH takes a moment)
BIND_FAILED = "Failed to create server socket"  # rpc-server's line when its port is taken


def tail(path: Path, lines: int = RPC_LAST_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line[:RPC_LINE_CHARS] for line in text.splitlines()[-lines:]]


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` listens on ``port`` (read from the kernel; no connection is made to it)."""
    try:
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
            for c in psutil.Process(pid).net_connections("tcp")
        )
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------- the helper's side


@dataclass
class RpcServer:
    """One rpc-server this agent runs for a model served on another machine."""

    model: Model
    helper: RpcHelper
    log_path: Path
    proc: asyncio.subprocess.Process | None = None
    port: int | None = None
    state: RpcState = "stopped"
    error: str | None = None
    stopping: bool = False
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class RpcServers:
    """The rpc-servers of this machine: one per model whose rpc: names it, started and stopped by that model's agent."""

    def __init__(self, core: AgentCore, placement: Placement) -> None:
        self.core = core
        self.placement = placement
        self.servers: dict[str, RpcServer] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.reload()

    def reload(self) -> None:
        """The models lab.yaml spreads over this machine (a pushed lab.yaml: kept servers keep running as they are)."""
        me = self.core.machine.name
        for model in self.core.lab.models:
            for helper in model.rpc:
                if helper.machine == me and model.name not in self.servers:
                    path = self.core.state_dir / "models" / f"rpc-{model.name}.log"
                    self.servers[model.name] = RpcServer(model, helper, path)
                    self._locks[model.name] = asyncio.Lock()

    def server(self, name: str) -> RpcServer:
        server = self.servers.get(name)
        if server is None:
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"no model named {name!r} is spread over {self.core.machine.name} (lab.yaml's rpc:)"
            )
        return server

    def ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports of the rpc-servers running here now: the only ones the node role may forward to."""
        return frozenset(
            s.port for s in self.servers.values() if s.port is not None and s.proc is not None and s.proc.returncode is None
        )

    def gpus(self, server: RpcServer) -> list[RpcGpu]:
        latest = self.core.latest
        out = []
        for index in server.helper.gpus:
            sample = next((g for g in latest.gpus if g.index == index), None) if latest is not None else None
            try:
                free: int | None = self.placement.free_bytes(index, {})
            except RemoteError:
                free = None
            out.append(RpcGpu(index=index, total_bytes=sample.mem_total_bytes if sample else None, free_bytes=free))
        return out

    @staticmethod
    def simulated(server: RpcServer) -> bool:
        """A sim-llamacpp model: its helpers run the simulated rpc-server (agents/orchestra/engines/llamacpp/twin_rpc_server.py)."""
        return engine_spec(server.model.engine).simulated

    def lends_cpu(self, server: RpcServer) -> bool:
        """No GPU lent: none named, or simulated ones to the real rpc-server (its processes run on the CPU): rpc-server's
        CPU backend. The simulated rpc-server lends the simulated GPUs (SIM)."""
        return not server.helper.gpus or (self.core.machine.simulated and not self.simulated(server))

    def status(self, server: RpcServer) -> RpcServerStatus:
        proc = server.proc
        return RpcServerStatus(
            model=server.model.name,
            machine=self.core.machine.name,
            state=server.state,
            port=server.port if server.state in ("starting", "running") else None,
            pid=proc.pid if proc is not None and proc.returncode is None else None,
            exit_code=proc.returncode if proc is not None else None,
            error=server.error[:RPC_ERROR_CHARS] if server.error else None,
            gpus=self.gpus(server),
            cpu=self.lends_cpu(server),
            last_lines=tail(server.log_path) if server.state in ("exited", "failed") else [],
        )

    def env(self, server: RpcServer) -> dict[str, str]:
        """The agent's PATH, HOME and locale, and the GPUs it lends (none: CUDA sees no GPU, rpc-server runs on the CPU)."""
        gpus = "" if self.lends_cpu(server) else ",".join(str(g) for g in server.helper.gpus)
        return minimal_env({"CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **server.model.env})

    async def start(self, name: str, need_bytes: int) -> RpcServerStatus:
        server = self.server(name)
        async with self._locks[name]:
            if server.proc is not None and server.proc.returncode is None:
                return self.status(server)
            binary = Path(sys.executable) if self.simulated(server) else llamacpp_build.find_rpc_server()
            if binary is None:
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"rpc-server is not on {self.core.machine.name}: {llamacpp_build.MAKE_HINT}, "
                    f"or set {llamacpp_build.RPC_BINARY_ENV}",
                )
            if need_bytes and not self.lends_cpu(server):
                for index in server.helper.gpus:
                    free = self.placement.free_bytes(index, {})
                    if free < need_bytes:
                        raise RemoteError(
                            ErrorCode.CONFLICT,
                            f"{name} needs {gib_text(need_bytes)} on GPU {index} of {self.core.machine.name}, "
                            f"{gib_text(max(0, free))} free: {gib_text(need_bytes - max(0, free))} missing",
                            {"gpu": index, "need_bytes": need_bytes, "free_bytes": free},
                        )
            server.error, server.stopping = None, False
            for attempt in range(1, BIND_TRIES + 1):
                await self._spawn(server, binary)
                if await self._listening(server):
                    server.state = "running"
                    self.claim(server, need_bytes)
                    server.watcher = asyncio.create_task(self._watch(server), name=f"rpc-server-{name}")
                    return self.status(server)
                lines = tail(server.log_path)
                if not any(BIND_FAILED in line for line in lines) or attempt == BIND_TRIES:
                    break
            code = server.proc.returncode if server.proc is not None else None  # None: it still runs, not listening
            await self._kill(server)
            server.state = "failed"
            server.error = (
                f"rpc-server did not listen on 127.0.0.1:{server.port} within {LISTEN_WAIT_S:.0f} s"
                if code is None
                else f"rpc-server exited with code {code} before it listened"
            )
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"{self.core.machine.name}: {server.error}: {' | '.join(tail(server.log_path, 5))}"
            )

    def claim(self, server: RpcServer, need_bytes: int) -> None:
        """Show the model's share on simulated GPUs lent (NVML machines see the real rpc-server's memory)."""
        if self.core.machine.simulated and not self.lends_cpu(server) and need_bytes:
            pid = server.proc.pid if server.proc is not None else 0
            self.core.claim_gpus(server.helper.gpus, f"rpc:{server.model.name}", server.model.name, need_bytes, 5.0, pid)

    async def _spawn(self, server: RpcServer, binary: Path) -> None:
        server.port = free_port()
        argv = [str(binary), "--host", "127.0.0.1", "--port", str(server.port)]  # never another address: no auth
        if self.simulated(server):
            argv[1:1] = ["-m", "agents.orchestra.engines.llamacpp.twin_rpc_server"]
            argv += ["--sim-parent-pid", str(os.getpid())]
        server.log_path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(copy_truncate, server.log_path, LOG_MAX_BYTES, LOG_KEEP)
        with open(server.log_path, "ab") as out:
            out.write(
                f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} cetlab starts rpc-server for {server.model.name}: {' '.join(argv)}\n".encode()
            )
            out.flush()
            server.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env(server),
                start_new_session=True,  # its own process group: stopped as one
            )
        server.state = "starting"

    async def _listening(self, server: RpcServer) -> bool:
        assert server.proc is not None and server.port is not None
        deadline = time.monotonic() + LISTEN_WAIT_S
        delay = 0.01
        while server.proc.returncode is None and time.monotonic() < deadline:
            if await asyncio.to_thread(listens, server.proc.pid, server.port):
                return True
            await asyncio.sleep(delay)
            delay = min(0.2, delay * 1.5)
        return False

    async def _watch(self, server: RpcServer) -> None:
        proc = server.proc
        assert proc is not None
        code = await proc.wait()
        if server.proc is not proc or server.stopping:
            return
        self.core.release_gpus(f"rpc:{server.model.name}")
        server.state = "failed" if code != 0 else "exited"
        server.error = f"rpc-server exited with code {code}" if code >= 0 else f"rpc-server was killed by signal {-code}"
        log.warning("%s: %s", server.model.name, server.error)

    async def _kill(self, server: RpcServer) -> None:
        self.core.release_gpus(f"rpc:{server.model.name}")
        proc = server.proc
        if proc is None or proc.returncode is not None:
            return
        server.stopping = True
        try:
            os.killpg(proc.pid, 15)
            await within(proc.wait(), STOP_GRACE_S)
        except ProcessLookupError:
            pass
        except TimeoutError:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            await proc.wait()

    async def stop(self, name: str) -> RpcServerStatus:
        server = self.server(name)
        async with self._locks[name]:
            await self._kill(server)
            if server.state in ("starting", "running"):
                server.state, server.error = "stopped", None
            return self.status(server)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._kill(s) for s in self.servers.values()), return_exceptions=True)
        for server in self.servers.values():
            if server.watcher is not None:
                server.watcher.cancel()

    def register(self) -> None:
        rpc = self.core.rpc

        @rpc.implements(MODELS_RPC_START)
        async def rpc_start(peer: Peer, params: RpcStartParams) -> RpcServerStatus:
            return await self.start(params.model, params.need_bytes)

        @rpc.implements(MODELS_RPC_STOP)
        async def rpc_stop(peer: Peer, params: RpcParams) -> RpcServerStatus:
            return await self.stop(params.model)

        @rpc.implements(MODELS_RPC_STATUS)
        async def rpc_status(peer: Peer, params: RpcParams) -> RpcServerStatus:
            return self.status(self.server(params.model))


# ---------------------------------------------------------------------------- the model's side


def shares(need_bytes: int, totals: list[int | None]) -> list[int]:
    """A model's bytes split over GPUs by each one's memory (as llama.cpp splits its layers); equal where one is unknown."""
    if not totals:
        return []
    if any(t is None or t <= 0 for t in totals):
        return [need_bytes // len(totals)] * len(totals)
    whole = sum(t for t in totals if t is not None)
    return [int(need_bytes * (t or 0) / whole) for t in totals]


class Spread:
    """The models of this machine spread over others: their helpers' rpc-servers, brought up first, stopped with them."""

    def __init__(self, core: AgentCore, placement: Placement, fail: Callable[[Slot, str], None]) -> None:
        self.core = core
        self.placement = placement
        self.fail = fail  # fails a model with the reason (the lifecycle's)
        self.peers: PeerClient | None = None
        self.forwards: dict[str, list[tuple[str, int]]] = {}  # model -> (helper, its rpc-server's port there)
        self.task: asyncio.Task[None] | None = None
        self.silent_since: dict[tuple[str, str], float] = {}

    def helpers(self) -> list[str]:
        me = self.core.machine.name
        return sorted({h.machine for m in self.core.lab.models if m.machine == me for h in m.rpc})

    async def start(self, slots: Callable[[], list[Slot]]) -> None:
        helpers = self.helpers()
        if not helpers:
            return
        from agents.runtime.peers import NODE_KEY_NAME, PeerClient  # SSH links only where a spread model is served

        self.peers = PeerClient(self.core.lab, self.core.state_dir, machines=helpers, topics=[], key_name=NODE_KEY_NAME)
        await self.peers.start()
        self.task = asyncio.create_task(self._watch(slots), name="spread-watch")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.peers is not None:
            await self.peers.stop()

    async def _request(self, machine: str, method: Method[P, R], params: P, timeout: float = 10.0, link_wait_s: float = 5.0) -> R:
        if self.peers is None or machine not in self.peers.links:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{self.core.machine.name} has no link to {machine} (restart its agent)")
        link = self.peers.links[machine]
        if not link.online.is_set():
            try:  # a link still connecting (this agent or the helper's just started) gets a moment
                await within(link.online.wait(), link_wait_s)
            except TimeoutError:
                pass
        return await request(self.peers, machine, method, params, timeout)

    def own_totals(self, gpus: list[int]) -> list[int | None]:
        latest = self.core.latest
        by_index = {g.index: g.mem_total_bytes for g in latest.gpus} if latest is not None else {}
        return [by_index.get(i) for i in gpus]

    async def bring_up(self, slot: Slot) -> list[str]:
        """Every helper's rpc-server, each checked for its share of the model's memory, and a forward to it here; returns
        llama-server's --rpc endpoints. A helper that cannot is said, naming it, and the others are stopped again."""
        model = slot.model
        try:
            statuses = await asyncio.gather(
                *(
                    self._request(h.machine, MODELS_RPC_STATUS, RpcParams(model=model.name), link_wait_s=LINK_WAIT_S)
                    for h in model.rpc
                )
            )
        except RemoteError as exc:
            raise EngineFailed(f"an rpc helper of {model.name} did not answer: {exc.message}") from None
        need = slot.need.bytes or 0  # lab.yaml's vram_gib, else the estimate from its GGUF (0: unknown, not checked)
        own = list(slot.gpus)
        totals = self.own_totals(own) + [g.total_bytes for s in statuses if not s.cpu for g in s.gpus]
        split = shares(need, totals)
        for index, share in zip(own, split):
            free = self.placement.free_bytes(index, {}, starting=slot.name)
            if need and free < share:
                raise EngineFailed(
                    f"{model.name} needs {gib_text(share)} on GPU {index} of {self.core.machine.name} (its share over "
                    f"{len(totals)} GPUs), {gib_text(max(0, free))} free"
                )
        slot.spread_share = dict(zip(own, split))
        rest = iter(split[len(own) :])
        per_helper = [max((next(rest) for _ in s.gpus), default=0) if not s.cpu else 0 for s in statuses]
        started: list[tuple[str, int]] = []
        self.forwards[slot.name] = started
        endpoints = []
        for helper, share in zip(model.rpc, per_helper):
            try:
                status = await self._request(
                    helper.machine,
                    MODELS_RPC_START,
                    RpcStartParams(model=model.name, need_bytes=share),
                    timeout=START_TIMEOUT_S,
                )
                if status.port is None:
                    raise RemoteError(ErrorCode.UNAVAILABLE, f"its rpc-server is {status.state}")
                started.append((helper.machine, status.port))
                assert self.peers is not None
                local = await self.peers.tcp_forward(helper.machine, status.port)
            except RemoteError as exc:
                await self.take_down(slot)
                raise EngineFailed(f"rpc helper {helper.machine} could not start: {exc.message}") from None
            endpoints.append(f"127.0.0.1:{local}")
        return endpoints

    async def take_down(self, slot: Slot) -> None:
        """Stop the model's rpc-servers on every helper (each one's failure logged, the others stopped all the same)."""
        started = self.forwards.pop(slot.name, [])
        if self.peers is not None:
            for machine, port in started:
                self.peers.drop_tcp_forward(machine, port)
        calls: list[Awaitable[RpcServerStatus]] = [
            self._request(h.machine, MODELS_RPC_STOP, RpcParams(model=slot.name)) for h in slot.model.rpc
        ]
        for helper, result in zip(slot.model.rpc, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(result, BaseException):
                log.warning("%s: stopping its rpc-server on %s: %s", slot.name, helper.machine, result)

    async def _watch(self, slots: Callable[[], list[Slot]]) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for slot in slots():
                if slot.model.rpc and slot.name in self.forwards and slot.state in MODEL_ENGINE_UP and not slot.busy:
                    try:
                        await self._check(slot)
                    except Exception:  # one model's trouble must not end the watch of the others
                        log.exception("%s: watching its rpc helpers failed", slot.name)

    async def _check(self, slot: Slot) -> None:
        now = time.time()
        for helper in slot.model.rpc:
            key = (slot.name, helper.machine)
            try:
                status = await self._request(helper.machine, MODELS_RPC_STATUS, RpcParams(model=slot.name), timeout=5.0)
            except ReplyInvalid as exc:
                log.warning("%s: helper %s answered a status that does not fit: %s", slot.name, helper.machine, exc.message)
                continue
            except RemoteError as exc:
                since = self.silent_since.setdefault(key, now)
                if now - since >= self.core.lab.alerts.offline_for_s:
                    self.silent_since.pop(key, None)
                    self.fail(slot, f"rpc helper {helper.machine} does not answer: {exc.message}")
                    return
                continue
            self.silent_since.pop(key, None)
            if status.state != "running":
                lines = " | ".join(line.rstrip() for line in status.last_lines[-3:])
                self.fail(
                    slot,
                    f"rpc helper {helper.machine}: its rpc-server {status.state}"
                    + (f" ({status.error})" if status.error else "")
                    + (f" | {lines}" if lines else ""),
                )
                return
