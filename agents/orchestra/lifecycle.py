"""Engine lifecycles: load, warm up, wake, sleep, stop, fail; and the operations (warm, sleep, cold, swap, cache) built on them."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agents.gpusupport.port import GpuSupportPort
from agents.jobs.port import JobsPort
from agents.orchestra.adopt import AdoptedProcess
from agents.orchestra.book import PoolBook
from agents.orchestra.engine import Engine, EngineDown, EngineRequestFailed
from agents.orchestra.engines import engine_class
from agents.orchestra.placement import Placement
from agents.orchestra.residency import Residency
from agents.orchestra.slot import SLEEP_RESIDUAL_BYTES, EngineFailed, Slot, gib_text
from agents.orchestra.spread import Spread
from agents.runtime.core import AgentCore
from agents.wire.documents import EngineFigures
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.base import ModelOp
from agents.wire.sections.models import ModelError, ModelProgress
from agents.wire.states import MODEL_AT_REST, MODEL_BRINGING_UP, MODEL_ENGINE_UP, MODEL_HOLDS_GPU, MODEL_SETTLED, ModelState

log = logging.getLogger("cetlab.orchestra")

AGENT_PID_FILE = (
    "agent.pid"  # in the state dir, locked while the agent runs (agents.shell.agent.PID_FILE_NAME): engines follow it
)
HEALTH_POLL_S = 0.1
HEALTH_POLL_FIRST_S = 0.01  # then 1.5x each time up to HEALTH_POLL_S
WARMUP_TIMEOUT_S = 900.0
DRAIN_POLL_S = 0.05  # a draining replica asks its engine this often whether its requests have ended
DRAIN_TICKS = 2  # ... and stays draining at least this many ticks, so that the gateway has seen it before it goes


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def running_engine(slot: Slot) -> Engine:
    """The engine a sleeping or warm model runs on (EngineFailed, said to the operator, when it has none)."""
    if slot.engine is None:
        raise EngineFailed(f"{slot.name} is {slot.state} with no engine")
    return slot.engine


class Lifecycle:
    """One engine's life, and the long operations on the pool that answer at once and run in a task."""

    def __init__(self, core: AgentCore, book: PoolBook, residency: Residency, placement: Placement) -> None:
        self.core = core
        self.book = book
        self.residency = residency
        self.placement = placement
        self.supervisors: list[asyncio.Task[None]] = []  # one per engine started or adopted: notices when it ends
        self.spread = Spread(core, placement, lambda slot, reason: self.fail(slot, slot.engine, reason))

    def missing(self, slot: Slot) -> RemoteError:
        """The refusal of a model whose weights are not at its path here: where, and the doctor's fix."""
        said = engine_class(slot.model.engine).missing_said(slot.path)
        return RemoteError(ErrorCode.MODEL_FILE_MISSING, f"model {slot.name} on {self.core.machine.name}: {said}")

    def new_engine(self, slot: Slot, gpus: list[int], check_gpus: bool = True) -> Engine:
        spec = engine_class(slot.model.engine).spec
        if slot.model.serves not in spec.serves:  # a pooling model on an engine that is never started as one
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"model {slot.name}: engine {spec.name} serves {', '.join(spec.serves)}, not {slot.model.serves} "
                "(lab.yaml's serves:)",
            )
        if not slot.path.exists() and not slot.model.make_tiny_if_missing:
            raise self.missing(slot)
        total = None
        latest = self.core.latest
        if gpus and latest is not None:
            total = next((g.mem_total_bytes for g in latest.gpus if g.index == gpus[0]), None)
        engine = engine_class(slot.model.engine)(
            slot.model, slot.path, self.core.machine.name, gpus, self.core.state_dir / "models" / f"{slot.name}.log", total
        )
        engine.agent_pid_file = self.core.state_dir / AGENT_PID_FILE
        if gpus and latest is not None:  # each GPU's memory: llama.cpp splits a model by it
            by_index = {g.index: g.mem_total_bytes for g in latest.gpus}
            engine.gpu_totals = [by_index.get(g) or 0 for g in gpus]
        if check_gpus and (support := self.core.find(GpuSupportPort)) is not None:  # its build runs on these GPUs, or the fix
            support.check_model(slot.model, gpus)
        engine.check()
        return engine

    def supervise(self, slot: Slot, engine: Engine) -> None:
        """Watch the engine's process from now on: its end fails the model (unless it was asked to stop)."""
        self.supervisors = [t for t in self.supervisors if not t.done()]
        self.supervisors.append(asyncio.create_task(self._supervise(slot, engine), name=f"supervise-{slot.name}"))

    async def _supervise(self, slot: Slot, engine: Engine) -> None:
        assert engine.proc is not None, "an engine is supervised once started"
        code = await engine.proc.wait()
        if engine.stopping or slot.engine is not engine:
            return
        if isinstance(engine.proc, AdoptedProcess):  # never "code -1": a restarted agent cannot see how it ended
            self.fail(
                slot,
                engine,
                "the engine ended; it was re-adopted after an agent restart, so its exit code and signal "
                "went to init, not to this agent: see its log",
            )
        else:
            self.fail(
                slot,
                engine,
                f"the engine exited with code {code}"
                if code is None or code >= 0
                else f"the engine was killed by {signal_name(-code)}",
            )
        if slot.op is not None and slot.busy and slot.op is not asyncio.current_task():
            slot.op.cancel()

    def fail(self, slot: Slot, engine: Engine | None, message: str) -> None:
        oom = engine is not None and engine.out_of_memory()
        if oom:
            message += ": CUDA out of memory (lower vram use: --max-model-len, --gpu-memory-utilization, or another GPU)"
        slot.error = ModelError(
            message=message,
            exit_code=engine.returncode if engine else None,
            oom=oom,
            log_tail=engine.log_tail(20) if engine else [],
            log_path=str(engine.log_path) if engine else None,
            t=time.time(),
        )
        slot.progress = None
        if slot.engine is engine:
            slot.engine = None
        self.book.set_state(slot, ModelState.FAILED)
        self.book.event(slot, "fail", detail={"message": message, "exit_code": slot.error.exit_code, "oom": oom})
        self.book.notice("error", f"{slot.name} failed on {self.core.machine.name}: {message}")
        if engine is not None and engine.returncode is None:
            asyncio.get_running_loop().create_task(engine.stop())
        if slot.model.rpc:  # its helpers' rpc-servers go with it
            asyncio.get_running_loop().create_task(self.spread.take_down(slot))

    async def _load(self, slot: Slot, gpus: list[int], engine: Engine) -> float:
        """cold/cached -> loading -> warming -> warm. Returns the seconds spent waiting on the engine."""
        slot.gpus, slot.error = gpus, None
        self.book.set_state(slot, ModelState.LOADING)
        if not slot.path.exists():
            await self.residency.make_tiny(slot)
        await self.residency.cache(slot, strict=False)
        slot.progress = ModelProgress(phase="starting")
        started = time.monotonic()
        slot.engine = slot.last_engine = engine
        if slot.model.rpc:  # the helpers' rpc-servers first: llama-server connects to them as it loads
            slot.progress = ModelProgress(phase="starting")
            engine.rpc_servers = await self.spread.bring_up(slot)
        await engine.start()
        self.book.claim(slot)
        self.book.remember_engines()  # a restarted agent finds (and reports) an engine it was loading
        self.supervise(slot, engine)
        deadline = started + slot.model.load_timeout_s
        slot.progress = ModelProgress(phase="loading")
        poll_s = HEALTH_POLL_FIRST_S  # a GGUF from the page cache is up in a fraction of a second: look often at first
        while not await engine.health():
            if engine.returncode is not None:
                raise EngineFailed(f"the engine exited with code {engine.returncode} while loading")
            if time.monotonic() > deadline:
                raise EngineFailed(f"no answer on /health after {slot.model.load_timeout_s:.0f} s (load_timeout_s)")
            await asyncio.sleep(poll_s)
            poll_s = min(HEALTH_POLL_S, poll_s * 1.5)
        load_s = time.monotonic() - started
        self.book.event(slot, "load", load_s, detail=engine.load_phases() or None)
        self.book.set_state(slot, ModelState.WARMING)
        slot.progress = ModelProgress(phase="warm-up")
        warm_started = time.monotonic()
        try:
            await engine.warm_up(WARMUP_TIMEOUT_S)
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"the warm-up request failed: {exc}") from None
        warmup_s = time.monotonic() - warm_started
        self.book.event(slot, "warmup", warmup_s)
        slot.progress = None
        self.book.set_state(slot, ModelState.WARM)
        return time.monotonic() - started

    async def _wake(self, slot: Slot) -> float:
        started = time.monotonic()
        self.book.set_state(slot, ModelState.LOADING)
        slot.progress = ModelProgress(phase="waking")
        try:
            await running_engine(slot).wake()
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"wake_up failed: {exc}") from None
        wake_s = time.monotonic() - started
        self.book.event(slot, "wake", wake_s)
        slot.progress = None
        self.book.set_state(slot, ModelState.WARM)
        return wake_s

    async def _sleep(self, slot: Slot) -> float:
        started = time.monotonic()
        slot.progress = ModelProgress(phase="going to sleep")
        try:
            await running_engine(slot).sleep(slot.model.sleep_level)
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"sleep failed: {exc}") from None
        seconds = time.monotonic() - started
        slot.progress = None
        self.book.event(slot, "sleep", seconds, detail={"level": slot.model.sleep_level})
        self.book.set_state(slot, ModelState.SLEEPING)
        return seconds

    async def _stop(self, slot: Slot) -> float:
        started = time.monotonic()
        engine, slot.engine = slot.engine, None
        if engine is not None:
            slot.progress = ModelProgress(phase="stopping")
            await engine.stop()
        if slot.model.rpc:
            await self.spread.take_down(slot)
        slot.progress = None
        await asyncio.to_thread(self.residency.measure, slot)
        seconds = time.monotonic() - started
        self.book.event(slot, "stop", seconds)
        self.book.set_state(slot, self.residency.rest_state(slot))
        return seconds

    @staticmethod
    def needs_drain(slot: Slot) -> bool:
        """A replica of a model that serves now: the gateway sends its requests to the other placements first."""
        return bool(slot.model.replicas) and slot.state == ModelState.WARM and slot.engine is not None

    async def drain(self, slot: Slot) -> None:
        """Before a replica goes out (swap, sleep, cold, rotation): mark it draining, which its ticks show and the
        gateway sends no new request to; then wait until its engine runs none, at most the model's drain_timeout_s.

        The engine's own count (vLLM's num_requests_running and _waiting, llama-server's requests_processing and
        _deferred, the simulators' the same) is the truth for every client, the gateway's and direct ones, and it
        survives a gateway restart; the gateway's retry before the first byte covers a request it sent just before
        the tick that said draining reached it."""
        if not self.needs_drain(slot):
            return
        engine = running_engine(slot)
        slot.draining = True  # its own flag, not a progress phase: an older console reads a newer agent's ticks
        started = time.monotonic()
        seen_at = started + DRAIN_TICKS * self.core.machine.sample_interval_s
        deadline = started + slot.model.drain_timeout_s
        running: float | None = None
        while True:
            now = time.monotonic()
            running = await self._in_flight(engine)
            if now >= seen_at and not running:
                break
            if now >= deadline:
                if running:
                    self.book.notice(
                        "warning",
                        f"{slot.name} on {self.core.machine.name}: {running:.0f} requests still running after draining "
                        f"{slot.model.drain_timeout_s:g} s (drain_timeout_s); taking it out anyway",
                    )
                break
            await asyncio.sleep(DRAIN_POLL_S)
        if running is None:
            log.warning("%s: its engine reports no running requests; drained for %d ticks only", slot.name, DRAIN_TICKS)
        self.book.event(slot, "drain", time.monotonic() - started, detail={"running": running})

    async def _in_flight(self, engine: Engine) -> float | None:
        """Requests the engine runs or queues now; None when it does not say (no metrics, or not answering)."""
        try:
            figures = EngineFigures.model_validate(await engine.metrics())
        except (EngineDown, EngineRequestFailed, ValueError):
            return None
        parts = [n for n in (figures.requests_running, figures.requests_waiting) if n is not None]
        return sum(parts) if parts else None

    @staticmethod
    def held_after_free(slot: Slot) -> int:
        if slot.state == ModelState.WARM and slot.engine is not None and slot.engine.can_sleep:
            return SLEEP_RESIDUAL_BYTES if slot.gpus else 0
        return slot.held_bytes() if slot.state == ModelState.SLEEPING else 0

    async def free(self, slot: Slot) -> float:
        """Take a model off its GPUs: sleep when the engine can, else stop; a sleeping one stays asleep (a replica
        drains first)."""
        await self.drain(slot)
        if slot.state == ModelState.WARM and slot.engine is not None and slot.engine.can_sleep:
            return await self._sleep(slot)
        if slot.state in MODEL_HOLDS_GPU:
            return await self._stop(slot)
        return 0.0

    async def _bring_up(self, slot: Slot, gpus: list[int], engine: Engine | None) -> float:
        if slot.state == ModelState.SLEEPING:
            return await self._wake(slot)
        if engine is None:
            raise EngineFailed(f"{slot.name} is {slot.state}: it needs a new engine to come up")
        return await self._load(slot, gpus, engine)

    # ------------------------------------------------------------------ operations

    def begin(self, slots: list[Slot], name: ModelOp, work: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        """Run one long operation on these models; the RPC answers at once, ticks show the rest."""
        for slot in slots:
            if slot.busy:
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        task = asyncio.get_running_loop().create_task(self._guard(slots, name, work), name=f"{name}-{slots[0].name}")
        for slot in slots:
            slot.op, slot.op_name = task, name
        return task

    async def _guard(self, slots: list[Slot], name: str, work: Callable[[], Awaitable[Any]]) -> Any:
        await asyncio.sleep(0)  # let begin mark the slots busy first
        try:
            return await work()
        except asyncio.CancelledError:
            for slot in slots:  # a half-started model is stopped; settled ones stay as they are
                if slot.state in MODEL_BRINGING_UP:
                    await self._stop(slot)
            raise
        except (EngineFailed, RemoteError) as exc:
            message = exc.message if isinstance(exc, RemoteError) else str(exc)
            failing = next((s for s in slots if s.state in MODEL_BRINGING_UP), None)
            if failing is not None:
                self.fail(failing, failing.engine or failing.last_engine, message)
            else:  # a settled model (a failed sleep or cache) stays as it is; the operator hears why
                self.book.notice("warning", f"{name} {slots[0].name}: {message}")
        except Exception:
            log.exception("%s of %s failed", name, ", ".join(s.name for s in slots))
            for slot in slots:
                if slot.state in MODEL_BRINGING_UP:
                    self.fail(slot, slot.engine, "internal error in the agent; see its log")
        finally:
            for slot in slots:
                slot.draining = False
                if slot.state in MODEL_SETTLED:
                    slot.progress = None

    def warm(self, slot: Slot) -> asyncio.Task[Any] | None:
        """Bring a model to warm; checks everything that can be checked before answering."""
        if slot.busy and slot.op_name in ("warm", "wake"):
            return slot.op
        if slot.state == ModelState.WARM and not slot.busy:
            return None
        if slot.busy:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        self._check_no_job_holds(slot)
        if slot.state == ModelState.SLEEPING:
            self.placement.check_fit(slot, slot.gpus)
            return self.begin([slot], "wake", lambda: self._wake(slot))
        gpus = list(slot.model.gpus)
        engine = self.new_engine(slot, gpus)
        self.placement.check_fit(slot, gpus)
        slot.gpus = gpus
        self.book.set_state(slot, ModelState.LOADING)  # reserve the GPUs before answering
        return self.begin([slot], "warm", lambda: self._load(slot, gpus, engine))

    def _check_no_job_holds(self, slot: Slot) -> None:
        """A model never comes up on GPUs a training job of this machine runs on (one the lab queue gave them to, or
        one started by hand): refused naming the job, with its expected end for a Retry-After."""
        jobs = self.core.find(JobsPort)
        wanted = set(slot.gpus) | set(slot.model.gpus)
        for job in jobs.views() if jobs is not None else []:
            taken = sorted(wanted & set(job.gpus))
            if job.active and taken:
                until = f" (about {job.eta_s / 60:.0f} min left)" if job.eta_s is not None else ""
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"GPU {','.join(map(str, taken))} of {self.core.machine.name} runs job {job.id} ({job.recipe}){until}: "
                    f"{slot.name} can come up there once it ends",
                    {"job": job.id, "retry_after_s": round(job.eta_s) if job.eta_s is not None else None},
                )

    def sleep(self, slot: Slot) -> asyncio.Task[Any] | None:
        if slot.state == ModelState.SLEEPING:
            return None
        if slot.state != ModelState.WARM or slot.engine is None:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {slot.state}; only a warm model can sleep")
        if not slot.engine.can_sleep:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"the {slot.model.engine} engine has no sleep mode; use `cetlab cold {slot.name}`"
            )
        if slot.pinned:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is pinned; unpin it first")

        async def work() -> float:
            await self.drain(slot)
            return await self._sleep(slot)

        return self.begin([slot], "sleep", work)

    def drain_and_stop(self, slot: Slot) -> asyncio.Task[Any]:
        """`cetlab cold` of a serving replica: drain it, then stop it (in a task: the reply does not wait)."""

        async def work() -> float:
            await self.drain(slot)
            return await self._stop(slot)

        return self.begin([slot], "cold", work)

    async def cold(self, slot: Slot) -> None:
        """Stop a model wherever it is, cancelling what it was doing."""
        if slot.op is not None and slot.busy:
            slot.op.cancel()
            await asyncio.gather(slot.op, return_exceptions=True)
        if slot.engine is not None or slot.state in MODEL_ENGINE_UP:
            await self._stop(slot)
        elif slot.state == ModelState.FAILED:
            slot.error = None
            self.book.set_state(slot, self.residency.rest_state(slot))

    def swap(self, out: Slot, incoming: Slot, rotation: bool = False) -> asyncio.Task[Any]:
        if out is incoming:
            raise RemoteError(ErrorCode.INVALID_PARAMS, "swap needs two different models")
        if out.state not in (ModelState.WARM, ModelState.SLEEPING):
            raise RemoteError(ErrorCode.CONFLICT, f"{out.name} is {out.state}, not serving: use `cetlab warm {incoming.name}`")
        if incoming.state in MODEL_HOLDS_GPU:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"{incoming.name} is already {incoming.state} on {self.core.machine.name} (GPUs {incoming.gpus})",
            )
        if out.pinned and not rotation:
            raise RemoteError(ErrorCode.CONFLICT, f"{out.name} is pinned; unpin it first")
        for slot in (out, incoming):
            if slot.busy:
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        engine = None
        if incoming.state == ModelState.SLEEPING:
            gpus = incoming.gpus  # a sleeping engine wakes where it sleeps
        else:
            gpus = list(out.gpus) if len(out.gpus) == len(incoming.model.gpus) else list(incoming.model.gpus)
            engine = self.new_engine(incoming, gpus)
        self.placement.check_fit(incoming, gpus, {out.name: self.held_after_free(out)})

        async def work() -> None:
            started = time.monotonic()
            engine_s = await self.free(out)
            freed = time.monotonic()
            engine_s += await self._bring_up(incoming, gpus, engine)
            done = time.monotonic()
            total_s = done - started
            self.book.unavailable_s += 0.0 if rotation else total_s  # a rotation counts its whole span itself
            self.book.kv_save(unavailable_s=self.book.unavailable_s)
            with self.core.store.transaction() as db:
                db.execute(
                    "INSERT INTO model_swaps (t, out_model, in_model, free_s, bring_up_s, total_s, engine_s, rotation) VALUES (?,?,?,?,?,?,?,?)",
                    (time.time(), out.name, incoming.name, freed - started, done - freed, total_s, engine_s, int(rotation)),
                )
            self.book.event(
                incoming, "swap", total_s, detail={"out": out.name, "engine_s": engine_s, "control_s": total_s - engine_s}
            )
            out.timings["swap_s"] = round(total_s, 3)

        return self.begin([out, incoming], "swap", work)

    async def cache(self, slot: Slot) -> asyncio.Task[Any]:
        if not slot.path.exists():
            raise self.missing(slot)
        await asyncio.to_thread(self.residency.measure, slot)
        budget = self.residency.budget_bytes()
        if budget is not None and slot.size_bytes > budget:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"{slot.name} is {gib_text(slot.size_bytes)}, more than the RAM-cache budget of "
                f"{self.core.machine.name} ({gib_text(budget)}, machines[].ram_cache_gib)",
            )

        async def work() -> None:
            await self.residency.cache(slot, strict=True)
            if slot.state in MODEL_AT_REST:
                self.book.set_state(slot, self.residency.rest_state(slot))

        return self.begin([slot], "cache", work)
