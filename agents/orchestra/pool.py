"""The model pool on one machine: states, placement, page-cache warming, swaps and rotation."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field

from agents.lab import NAME_RE, Model
from agents.orchestra import pagecache
from agents.orchestra.adopt import adopt, remember
from agents.orchestra.engine import GIB, Engine, EngineDown, EngineRequestFailed
from agents.orchestra.rotation import Candidate, plan_moves
from agents.orchestra.sim_engine import SimEngine
from agents.orchestra.transformers_engine import TransformersEngine
from agents.orchestra.vllm import VllmEngine
from agents.protocol import EVENT_NOTICE, ErrorCode, RemoteError, Role, Telemetry

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.orchestra")

ENGINES: dict[str, type[Engine]] = {"sim": SimEngine, "vllm": VllmEngine, "transformers": TransformersEngine}
UP = ("loading", "warming", "warm")  # states that hold the model's GPUs
SETTLED = ("cold", "cached", "warm", "sleeping", "failed")
CACHED_MIN_FRACTION = 0.9  # a model counts as cached when this share of its files is in RAM
SLEEP_RESIDUAL_BYTES = GIB // 2  # CUDA context and buffers a sleeping vLLM keeps on each GPU
METRICS_EVERY_S = 2.0
RESIDENCY_EVERY_S = 5.0
HEALTH_POLL_S = 0.1
WARMUP_TIMEOUT_S = 900.0
OVERHEAD_TARGET_PCT = 1.0
MAX_SEQS_FOR_UTIL = 8  # requests at which a simulated GPU shows full load

SCHEMA = [
    """CREATE TABLE model_events (id INTEGER PRIMARY KEY, t REAL NOT NULL, model TEXT NOT NULL, event TEXT NOT NULL,
       from_state TEXT, to_state TEXT, duration_s REAL, detail TEXT)""",
    "CREATE INDEX model_events_by_model ON model_events(model, t)",
    """CREATE TABLE model_swaps (id INTEGER PRIMARY KEY, t REAL NOT NULL, out_model TEXT NOT NULL, in_model TEXT NOT NULL,
       free_s REAL, bring_up_s REAL, total_s REAL, engine_s REAL, rotation INTEGER NOT NULL DEFAULT 0)""",
    "CREATE TABLE orchestra_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]


class ModelParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(pattern=NAME_RE)


class PinParams(ModelParams):
    pinned: bool = True


class SwapParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    out: str = Field(pattern=NAME_RE)
    in_: str = Field(alias="in", pattern=NAME_RE)


class AdapterParams(ModelParams):
    name: str = Field(pattern=NAME_RE)
    path: str = Field(min_length=1, max_length=4096)


class EngineFailed(Exception):
    """The engine died or never became healthy; the message says what to look at."""


@dataclass(eq=False)
class Slot:
    """One model of this machine and everything known about it."""

    model: Model
    path: Path
    gpus: list[int]
    state: str = "cold"
    since: float = field(default_factory=time.time)
    engine: Engine | None = None
    last_engine: Engine | None = None  # for logs after a stop or a failure
    op: asyncio.Task | None = None
    op_name: str | None = None
    progress: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    pinned: bool = False
    cached_bytes: int = 0
    size_bytes: int = 0
    last_used: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # last load_s, warmup_s, wake_s, swap_s, cache_s
    _tokens: tuple[float, float] | None = None  # (monotonic time, generation tokens) of the last poll

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def busy(self) -> bool:
        return self.op is not None and not self.op.done()

    @property
    def cached_fraction(self) -> float | None:
        return None if not self.size_bytes else round(self.cached_bytes / self.size_bytes, 3)

    def held_bytes(self) -> int:
        """What this model holds on each of its GPUs now, by its state (from its VRAM estimate)."""
        if not self.gpus:
            return 0
        if self.state in UP:
            return int(self.model.vram_gib * GIB / len(self.gpus))
        return SLEEP_RESIDUAL_BYTES if self.state == "sleeping" else 0


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


class OrchestraComponent:
    """The agent's model pool: the models whose machine is this one."""

    name = "models"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.slots: dict[str, Slot] = {}
        self._tasks: list[asyncio.Task] = []
        self._held_at_sample: dict[str, tuple[tuple[int, ...], int, bool]] = {}
        self._sampled = asyncio.Event()  # placement needs one GPU sample first
        self._rotation_task: asyncio.Task | None = None
        self.rotation_index = -1  # -1: the start set (orchestra.warm); then positions in orchestra.rotation
        self.next_rotation_at: float | None = None
        self.since = time.time()
        self.unavailable_s = 0.0
        self.last_rotation: dict[str, Any] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, agent: Agent) -> None:
        self.agent = agent
        lab, machine = agent.lab, agent.machine.name
        agent.store.migrate(self.name, SCHEMA)
        pinned = set(lab.orchestra.pinned)
        for model in lab.models:
            if model.machine == machine:
                self.slots[model.name] = Slot(model, lab.resolve(model.path), list(model.gpus), pinned=model.name in pinned)
        kv = {row["key"]: json.loads(row["value"]) for row in agent.store.query("SELECT key, value FROM orchestra_kv")}
        for name, value in (kv.get("pins") or {}).items():
            if name in self.slots:
                self.slots[name].pinned = value
        self.since = kv.get("since") or time.time()
        self.unavailable_s = kv.get("unavailable_s") or 0.0
        self.rotation_index = kv.get("rotation_index", -1)
        self.last_rotation = kv.get("last_rotation")
        self._kv_save(since=self.since)
        for slot in self.slots.values():
            for row in agent.store.query(
                "SELECT event, duration_s FROM model_events WHERE model=? AND event IN ('load','warmup','wake','swap','cache') "
                "AND id IN (SELECT MAX(id) FROM model_events WHERE model=? GROUP BY event)", (slot.name, slot.name)):
                slot.timings[f"{row['event']}_s"] = row["duration_s"]
        await asyncio.to_thread(self._make_placeholders)
        await asyncio.to_thread(self._measure_all)
        for slot in self.slots.values():
            slot.state = self._rest_state(slot)
        await adopt(self, kv.get("engines") or {})  # what a previous agent left running (systemd restart, crash)
        self._register(agent)
        if self.slots:
            plan = lab.orchestra
            if plan.rotate_every and plan.rotation:
                self.next_rotation_at = kv.get("next_rotation_at") or time.time() + plan.rotate_every
            self._tasks.append(asyncio.create_task(self._loop(), name="orchestra"))
            self._tasks.append(asyncio.create_task(self._bring_up_plan(), name="orchestra-start"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._rotation_task is not None:
            self._rotation_task.cancel()
        ops = [s.op for s in self.slots.values() if s.busy]
        for task in ops:
            task.cancel()
        await asyncio.gather(*self._tasks, *ops, return_exceptions=True)
        if not self.agent.keep_engines:  # else they keep serving and the next agent re-adopts them
            await asyncio.gather(*(s.engine.stop() for s in self.slots.values() if s.engine), return_exceptions=True)
        for slot in self.slots.values():
            self.agent.release_gpus(f"model:{slot.name}")

    def on_telemetry(self, telemetry: Telemetry) -> None:
        # what our models held when this sample was taken: placement adds what changed since
        nvml = not telemetry.simulated
        self._held_at_sample = {
            s.name: (tuple(s.gpus), s.held_bytes(), nvml and s.state == "loading") for s in self.slots.values()
        }
        self._sampled.set()

    def section(self) -> Any:
        if not self.slots:
            return None
        return {"models": [self._json(s) for s in self.slots.values()], "rotation": self._rotation_json()}

    # ------------------------------------------------------------------ JSON

    def _json(self, slot: Slot) -> dict[str, Any]:
        m = slot.metrics
        engine = slot.engine
        return {
            "name": slot.name,
            "machine": slot.model.machine,
            "engine": slot.model.engine,
            "state": slot.state,
            "since": round(slot.since, 3),
            "gpus": slot.gpus,
            "vram_bytes": int(slot.model.vram_gib * GIB),
            "cached_fraction": slot.cached_fraction,
            "size_bytes": slot.size_bytes,
            "load_s": slot.timings.get("load_s"),
            "warmup_s": slot.timings.get("warmup_s"),
            "wake_s": slot.timings.get("wake_s"),
            "swap_s": slot.timings.get("swap_s"),
            "requests_running": m.get("requests_running"),
            "requests_waiting": m.get("requests_waiting"),
            "tokens_per_s": m.get("tokens_per_s"),
            "kv_cache_pct": m.get("kv_cache_pct"),
            "ttft_s": m.get("ttft_s"),
            # engine counters (reset when the engine restarts); the cost ledger prices tokens served from them
            "prompt_tokens_total": m.get("prompt_tokens_total"),
            "generation_tokens_total": m.get("generation_tokens_total"),
            "endpoint": engine.endpoint if engine is not None else None,
            "served_name": engine.served_name if engine is not None else (slot.model.served_name or slot.model.name),
            "pinned": slot.pinned,
            "op": slot.op_name if slot.busy else None,
            "progress": slot.progress,
            "error": slot.error,
            "cloud_equivalent": slot.model.cloud_equivalent,
            "simulated": slot.model.engine == "sim",
        }

    def _rotation_json(self) -> dict[str, Any]:
        plan = self.agent.lab.orchestra
        wall_s = max(1e-9, time.time() - self.since)
        sets = plan.rotation
        return {
            "plan": sets,
            "every_s": plan.rotate_every,
            "index": self.rotation_index if sets and self.rotation_index >= 0 else None,
            "next_set": sets[(self.rotation_index + 1) % len(sets)] if sets else None,
            "next_at": self.next_rotation_at,
            "running": self._rotation_task is not None and not self._rotation_task.done(),
            "pinned": sorted(s.name for s in self.slots.values() if s.pinned),
            "unavailable_s": round(self.unavailable_s, 3),
            "wall_s": round(wall_s, 1),
            "overhead_pct": round(100 * self.unavailable_s / wall_s, 4),
            "target_pct": OVERHEAD_TARGET_PCT,
            "last": self.last_rotation,
        }

    # ------------------------------------------------------------------ bookkeeping

    def _kv_save(self, **values: Any) -> None:
        with self.agent.store.transaction() as db:
            for key, value in values.items():
                db.execute("INSERT OR REPLACE INTO orchestra_kv VALUES (?, ?)", (key, json.dumps(value)))

    def _event(self, slot: Slot, event: str, duration_s: float | None = None, detail: Any = None,
               from_state: str | None = None, to_state: str | None = None) -> None:
        with self.agent.store.transaction() as db:
            db.execute(
                "INSERT INTO model_events (t, model, event, from_state, to_state, duration_s, detail) VALUES (?,?,?,?,?,?,?)",
                (time.time(), slot.name, event, from_state, to_state, duration_s, None if detail is None else json.dumps(detail)),
            )
        if duration_s is not None and event in ("load", "warmup", "wake", "swap", "cache"):
            slot.timings[f"{event}_s"] = round(duration_s, 3)

    def _set_state(self, slot: Slot, state: str) -> None:
        if slot.state == state:
            return
        now = time.time()
        self._event(slot, "state", round(now - slot.since, 3), from_state=slot.state, to_state=state)
        log.info("%s: %s -> %s", slot.name, slot.state, state)
        slot.state, slot.since = state, now
        if state in UP or state == "sleeping":
            slot.last_used = now
        if state != "warm":
            slot.metrics, slot._tokens = {}, None
        self._claim(slot)
        self._kv_save(engines=remember(self.slots))

    def _claim(self, slot: Slot, util_pct: float | None = None) -> None:
        """Show the model on simulated GPUs (NVML machines see the real process)."""
        key = f"model:{slot.name}"
        held = slot.held_bytes()
        if not held:
            self.agent.release_gpus(key)
            return
        if util_pct is None:
            util_pct = {"loading": 25.0, "warming": 95.0, "warm": 10.0}.get(slot.state, 0.0)
        pid = slot.engine.pid if slot.engine and slot.engine.pid else 0
        self.agent.claim_gpus(slot.gpus, key, f"model {slot.name} ({slot.model.engine})", held, util_pct, pid)

    def _notice(self, level: str, message: str) -> None:
        self.agent.notify(EVENT_NOTICE, {"level": level, "message": message, "machine": self.agent.machine.name})

    # ------------------------------------------------------------------ page cache

    def _make_placeholders(self) -> None:
        for slot in self.slots.values():
            size_mib = slot.model.sim.placeholder_mib
            if slot.model.engine == "sim" and size_mib is not None and not slot.path.exists():
                pagecache.write_placeholder(slot.path, int(size_mib * 1024 * 1024))

    async def _make_tiny(self, slot: Slot) -> None:
        """The demo's tiny Llama, made in a child process (torch stays out of the agent)."""
        slot.progress = {"phase": "making the tiny model"}
        code = "import sys; from agents.train.tiny import make_tiny_model; make_tiny_model(sys.argv[1])"
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(slot.path), stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            raise EngineFailed(f"making the tiny model at {slot.path} failed: {output.decode(errors='replace')[-300:]}")
        await asyncio.to_thread(self._measure, slot)

    def _measure(self, slot: Slot) -> None:
        files = pagecache.model_files(slot.path) if slot.path.exists() else []
        found = pagecache.residency(files)
        slot.cached_bytes, slot.size_bytes = found.resident_bytes, found.total_bytes

    def _measure_all(self) -> None:
        for slot in self.slots.values():
            self._measure(slot)

    def _rest_state(self, slot: Slot) -> str:
        fraction = slot.cached_fraction
        return "cached" if fraction is not None and fraction >= CACHED_MIN_FRACTION else "cold"

    def _budget_bytes(self) -> int | None:
        gib = self.agent.machine.ram_cache_gib
        return None if gib is None else int(gib * GIB)

    async def _make_room(self, slot: Slot, strict: bool) -> bool:
        """Evict least recently used models until this one fits the RAM-cache budget."""
        budget = self._budget_bytes()
        if budget is None:
            return True
        if slot.size_bytes > budget:
            if strict:
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {_gib(slot.size_bytes)}, more than the RAM-cache budget of "
                                  f"{self.agent.machine.name} ({_gib(budget)}, machines[].ram_cache_gib)")
            return False
        others = [s for s in self.slots.values() if s is not slot and s.cached_bytes and not (s.busy and s.state == "loading")]
        # idle models go first, then those already on a GPU (they no longer read their files); oldest use first
        others.sort(key=lambda s: (s.state in UP or s.state == "sleeping", s.last_used))
        used = sum(s.cached_bytes for s in others)
        while used + slot.size_bytes - slot.cached_bytes > budget and others:
            victim = others.pop(0)
            files = pagecache.model_files(victim.path)
            await asyncio.to_thread(pagecache.evict, files)
            before = victim.cached_bytes
            await asyncio.to_thread(self._measure, victim)
            used -= before - victim.cached_bytes
            self._event(victim, "evict", detail={"for": slot.name, "freed_bytes": before - victim.cached_bytes})
            if victim.state == "cached":
                self._set_state(victim, self._rest_state(victim))
        return used + slot.size_bytes - slot.cached_bytes <= budget

    async def _cache(self, slot: Slot, strict: bool) -> None:
        """Pre-read the model's files into the page cache, within the budget, with progress."""
        if not await self._make_room(slot, strict):
            if strict:
                raise RemoteError(ErrorCode.CONFLICT, f"the RAM-cache budget of {self.agent.machine.name} is taken by models in use")
            return
        slot.progress = {"phase": "caching", "done_bytes": 0, "total_bytes": slot.size_bytes}

        def progress(done: int, total_bytes: int) -> None:
            slot.progress = {"phase": "caching", "done_bytes": done, "total_bytes": total_bytes}

        try:
            read_bytes, seconds = await asyncio.to_thread(pagecache.warm, pagecache.model_files(slot.path), progress)
        except OSError as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"cannot read the files of {slot.name} on {self.agent.machine.name}: {exc}") from None
        await asyncio.to_thread(self._measure, slot)
        slot.last_used = time.time()
        slot.progress = None
        self._event(slot, "cache", seconds, detail={"bytes": read_bytes, "bytes_per_s": read_bytes / seconds if seconds else None})

    # ------------------------------------------------------------------ placement

    def _free_bytes(self, index: int, after: dict[str, int]) -> int:
        """Free memory of one GPU: the last sample, corrected by what our models changed since
        and by what the models in ``after`` will hold per GPU once the operation has moved them."""
        telemetry = self.agent.latest
        gpu = next((g for g in telemetry.gpus if g.index == index), None) if telemetry else None
        if gpu is None or gpu.failed or gpu.mem_total_bytes is None or gpu.mem_used_bytes is None:
            why = gpu.failed if gpu is not None and gpu.failed else "not reported"
            raise RemoteError(ErrorCode.UNAVAILABLE, f"GPU {index} of {self.agent.machine.name} is {why}: cannot place a model there")
        free = gpu.mem_total_bytes - gpu.mem_used_bytes
        for slot in self.slots.values():
            gpus, held, invisible = self._held_at_sample.get(slot.name, ((), 0, False))
            if index in gpus and not invisible:
                free += held
            if index in slot.gpus:
                free -= after.get(slot.name, slot.held_bytes())
        return free

    def _check_fit(self, slot: Slot, gpus: list[int], after: dict[str, int] | None = None) -> None:
        """Refuse (CONFLICT, saying how much is missing) when the model's VRAM estimate does not fit."""
        if not gpus or not slot.model.vram_gib:
            return
        after = {**(after or {}), slot.name: 0}
        need = int(slot.model.vram_gib * GIB / len(gpus))
        for index in gpus:
            free = self._free_bytes(index, after)
            if free < need:
                holders = [s.name for s in self.slots.values() if index in s.gpus and s.held_bytes() and s.name not in after]
                hint = (f"; GPU {index} holds {', '.join(holders)}: `cetlab swap {holders[0]} {slot.name}` or `cetlab sleep {holders[0]}`"
                        if holders else "")
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"{slot.name} needs {_gib(need)} on GPU {index} of {self.agent.machine.name}, {_gib(max(0, free))} free: "
                    f"{_gib(need - max(0, free))} missing{hint}",
                    {"gpu": index, "need_bytes": need, "free_bytes": free, "missing_bytes": need - free},
                )

    # ------------------------------------------------------------------ engines

    def _slot(self, name: str) -> Slot:
        slot = self.slots.get(name)
        if slot is not None:
            return slot
        elsewhere = next((m.machine for m in self.agent.lab.models if m.name == name), None)
        if elsewhere is not None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"{name} runs on {elsewhere}, not {self.agent.machine.name}")
        raise RemoteError(ErrorCode.NOT_FOUND, f"no model named {name!r} on {self.agent.machine.name} (models here: {', '.join(self.slots) or 'none'})")

    def _new_engine(self, slot: Slot, gpus: list[int]) -> Engine:
        if not slot.path.exists() and not slot.model.make_tiny_if_missing:
            raise RemoteError(ErrorCode.NOT_FOUND, f"model path {slot.path} of {slot.name} does not exist on {self.agent.machine.name}")
        total = None
        if gpus and self.agent.latest is not None:
            total = next((g.mem_total_bytes for g in self.agent.latest.gpus if g.index == gpus[0]), None)
        engine = ENGINES[slot.model.engine](slot.model, slot.path, self.agent.machine.name, gpus,
                                            self.agent.state_dir / "models" / f"{slot.name}.log", total)
        engine.agent_pid_file = self.agent.pid_file
        engine.check()
        return engine

    async def _supervise(self, slot: Slot, engine: Engine) -> None:
        code = await engine.proc.wait()
        if engine.stopping or slot.engine is not engine:
            return
        self._fail(slot, engine, f"the engine exited with code {code}")
        if slot.busy and slot.op is not asyncio.current_task():
            slot.op.cancel()

    def _fail(self, slot: Slot, engine: Engine | None, message: str) -> None:
        oom = engine is not None and engine.out_of_memory()
        if oom:
            message += ": CUDA out of memory (lower vram use: --max-model-len, --gpu-memory-utilization, or another GPU)"
        slot.error = {
            "message": message,
            "exit_code": engine.returncode if engine else None,
            "oom": oom,
            "log_tail": engine.log_tail(20) if engine else [],
            "log_path": str(engine.log_path) if engine else None,
            "t": time.time(),
        }
        slot.progress = None
        if slot.engine is engine:
            slot.engine = None
        self._set_state(slot, "failed")
        self._event(slot, "fail", detail={"message": message, "exit_code": slot.error["exit_code"], "oom": oom})
        self._notice("error", f"{slot.name} failed on {self.agent.machine.name}: {message}")
        if engine is not None and engine.returncode is None:
            asyncio.get_running_loop().create_task(engine.stop())

    async def _load(self, slot: Slot, gpus: list[int], engine: Engine) -> float:
        """cold/cached -> loading -> warming -> warm. Returns the seconds spent waiting on the engine."""
        slot.gpus, slot.error = gpus, None
        self._set_state(slot, "loading")
        if not slot.path.exists():
            await self._make_tiny(slot)
        await self._cache(slot, strict=False)
        slot.progress = {"phase": "starting"}
        started = time.monotonic()
        slot.engine = slot.last_engine = engine
        await engine.start()
        self._claim(slot)
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(self._supervise(slot, engine), name=f"supervise-{slot.name}"))
        deadline = started + slot.model.load_timeout_s
        slot.progress = {"phase": "loading"}
        while not await engine.health():
            if engine.returncode is not None:
                raise EngineFailed(f"the engine exited with code {engine.returncode} while loading")
            if time.monotonic() > deadline:
                raise EngineFailed(f"no answer on /health after {slot.model.load_timeout_s:.0f} s (load_timeout_s)")
            await asyncio.sleep(HEALTH_POLL_S)
        load_s = time.monotonic() - started
        self._event(slot, "load", load_s, detail=engine.load_phases() or None)
        self._set_state(slot, "warming")
        slot.progress = {"phase": "warm-up"}
        warm_started = time.monotonic()
        try:
            await engine.warm_up(WARMUP_TIMEOUT_S)
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"the warm-up request failed: {exc}") from None
        warmup_s = time.monotonic() - warm_started
        self._event(slot, "warmup", warmup_s)
        slot.progress = None
        self._set_state(slot, "warm")
        return time.monotonic() - started

    async def _wake(self, slot: Slot) -> float:
        started = time.monotonic()
        self._set_state(slot, "loading")
        slot.progress = {"phase": "waking"}
        try:
            await slot.engine.wake()
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"wake_up failed: {exc}") from None
        wake_s = time.monotonic() - started
        self._event(slot, "wake", wake_s)
        slot.progress = None
        self._set_state(slot, "warm")
        return wake_s

    async def _sleep(self, slot: Slot) -> float:
        started = time.monotonic()
        slot.progress = {"phase": "going to sleep"}
        try:
            await slot.engine.sleep(slot.model.sleep_level)
        except (EngineDown, EngineRequestFailed) as exc:
            raise EngineFailed(f"sleep failed: {exc}") from None
        seconds = time.monotonic() - started
        slot.progress = None
        self._event(slot, "sleep", seconds, detail={"level": slot.model.sleep_level})
        self._set_state(slot, "sleeping")
        return seconds

    async def _stop(self, slot: Slot) -> float:
        started = time.monotonic()
        engine, slot.engine = slot.engine, None
        if engine is not None:
            slot.progress = {"phase": "stopping"}
            await engine.stop()
        slot.progress = None
        await asyncio.to_thread(self._measure, slot)
        seconds = time.monotonic() - started
        self._event(slot, "stop", seconds)
        self._set_state(slot, self._rest_state(slot))
        return seconds

    @staticmethod
    def _held_after_free(slot: Slot) -> int:
        if slot.state == "warm" and slot.engine is not None and slot.engine.can_sleep:
            return SLEEP_RESIDUAL_BYTES if slot.gpus else 0
        return slot.held_bytes() if slot.state == "sleeping" else 0

    async def _free(self, slot: Slot) -> float:
        """Take a model off its GPUs: sleep when the engine can, else stop; a sleeping one stays asleep."""
        if slot.state == "warm" and slot.engine is not None and slot.engine.can_sleep:
            return await self._sleep(slot)
        if slot.state in UP:
            return await self._stop(slot)
        return 0.0

    async def _bring_up(self, slot: Slot, gpus: list[int], engine: Engine | None) -> float:
        if slot.state == "sleeping":
            return await self._wake(slot)
        return await self._load(slot, gpus, engine)

    # ------------------------------------------------------------------ operations

    def _begin(self, slots: list[Slot], name: str, work: Callable[[], Awaitable[Any]]) -> asyncio.Task:
        """Run one long operation on these models; the RPC answers at once, ticks show the rest."""
        for slot in slots:
            if slot.busy:
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        task = asyncio.get_running_loop().create_task(self._guard(slots, name, work), name=f"{name}-{slots[0].name}")
        for slot in slots:
            slot.op, slot.op_name = task, name
        return task

    async def _guard(self, slots: list[Slot], name: str, work: Callable[[], Awaitable[Any]]) -> Any:
        await asyncio.sleep(0)  # let _begin mark the slots busy first
        try:
            return await work()
        except asyncio.CancelledError:
            for slot in slots:  # a half-started model is stopped; settled ones stay as they are
                if slot.state in ("loading", "warming"):
                    await self._stop(slot)
            raise
        except (EngineFailed, RemoteError) as exc:
            message = exc.message if isinstance(exc, RemoteError) else str(exc)
            failing = next((s for s in slots if s.state in ("loading", "warming")), None)
            if failing is not None:
                self._fail(failing, failing.engine or failing.last_engine, message)
            else:  # a settled model (a failed sleep or cache) stays as it is; the operator hears why
                self._notice("warning", f"{name} {slots[0].name}: {message}")
        except Exception:
            log.exception("%s of %s failed", name, ", ".join(s.name for s in slots))
            for slot in slots:
                if slot.state in ("loading", "warming"):
                    self._fail(slot, slot.engine, "internal error in the agent; see its log")
        finally:
            for slot in slots:
                if slot.state in SETTLED:
                    slot.progress = None

    def warm(self, slot: Slot) -> asyncio.Task | None:
        """Bring a model to warm; checks everything that can be checked before answering."""
        if slot.busy and slot.op_name in ("warm", "wake"):
            return slot.op
        if slot.state == "warm" and not slot.busy:
            return None
        if slot.busy:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        if slot.state == "sleeping":
            self._check_fit(slot, slot.gpus)
            return self._begin([slot], "wake", lambda: self._wake(slot))
        gpus = list(slot.model.gpus)
        engine = self._new_engine(slot, gpus)
        self._check_fit(slot, gpus)
        slot.gpus = gpus
        self._set_state(slot, "loading")  # reserve the GPUs before answering
        return self._begin([slot], "warm", lambda: self._load(slot, gpus, engine))

    def sleep(self, slot: Slot) -> asyncio.Task | None:
        if slot.state == "sleeping":
            return None
        if slot.state != "warm" or slot.engine is None:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {slot.state}; only a warm model can sleep")
        if not slot.engine.can_sleep:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"the {slot.model.engine} engine has no sleep mode; use `cetlab cold {slot.name}`")
        if slot.pinned:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is pinned; unpin it first")
        return self._begin([slot], "sleep", lambda: self._sleep(slot))

    async def cold(self, slot: Slot) -> None:
        """Stop a model wherever it is, cancelling what it was doing."""
        if slot.busy:
            slot.op.cancel()
            await asyncio.gather(slot.op, return_exceptions=True)
        if slot.engine is not None or slot.state in UP or slot.state == "sleeping":
            await self._stop(slot)
        elif slot.state == "failed":
            slot.error = None
            self._set_state(slot, self._rest_state(slot))

    def swap(self, out: Slot, incoming: Slot, rotation: bool = False) -> asyncio.Task:
        if out is incoming:
            raise RemoteError(ErrorCode.INVALID_PARAMS, "swap needs two different models")
        if out.state not in ("warm", "sleeping"):
            raise RemoteError(ErrorCode.CONFLICT, f"{out.name} is {out.state}, not serving: use `cetlab warm {incoming.name}`")
        if incoming.state in UP:
            raise RemoteError(ErrorCode.CONFLICT, f"{incoming.name} is already {incoming.state} on {self.agent.machine.name} (GPUs {incoming.gpus})")
        if out.pinned and not rotation:
            raise RemoteError(ErrorCode.CONFLICT, f"{out.name} is pinned; unpin it first")
        for slot in (out, incoming):
            if slot.busy:
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is busy ({slot.op_name}); wait, or `cetlab cold {slot.name}`")
        engine = None
        if incoming.state == "sleeping":
            gpus = incoming.gpus  # a sleeping engine wakes where it sleeps
        else:
            gpus = list(out.gpus) if len(out.gpus) == len(incoming.model.gpus) else list(incoming.model.gpus)
            engine = self._new_engine(incoming, gpus)
        self._check_fit(incoming, gpus, {out.name: self._held_after_free(out)})

        async def work() -> None:
            started = time.monotonic()
            engine_s = await self._free(out)
            freed = time.monotonic()
            engine_s += await self._bring_up(incoming, gpus, engine)
            done = time.monotonic()
            total_s = done - started
            self.unavailable_s += 0.0 if rotation else total_s  # a rotation counts its whole span itself
            self._kv_save(unavailable_s=self.unavailable_s)
            with self.agent.store.transaction() as db:
                db.execute("INSERT INTO model_swaps (t, out_model, in_model, free_s, bring_up_s, total_s, engine_s, rotation) VALUES (?,?,?,?,?,?,?,?)",
                           (time.time(), out.name, incoming.name, freed - started, done - freed, total_s, engine_s, int(rotation)))
            self._event(incoming, "swap", total_s, detail={"out": out.name, "engine_s": engine_s, "control_s": total_s - engine_s})
            out.timings["swap_s"] = round(total_s, 3)

        return self._begin([out, incoming], "swap", work)

    async def cache(self, slot: Slot) -> asyncio.Task:
        if not slot.path.exists():
            raise RemoteError(ErrorCode.NOT_FOUND, f"model path {slot.path} of {slot.name} does not exist on {self.agent.machine.name}")
        await asyncio.to_thread(self._measure, slot)
        budget = self._budget_bytes()
        if budget is not None and slot.size_bytes > budget:
            raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {_gib(slot.size_bytes)}, more than the RAM-cache budget of "
                              f"{self.agent.machine.name} ({_gib(budget)}, machines[].ram_cache_gib)")

        async def work() -> None:
            await self._cache(slot, strict=True)
            if slot.state in ("cold", "cached"):
                self._set_state(slot, self._rest_state(slot))

        return self._begin([slot], "cache", work)

    # ------------------------------------------------------------------ rotation

    async def rotate(self) -> dict[str, Any]:
        """Move to the next warm set of the plan: swaps on shared GPUs first, then the rest."""
        plan = self.agent.lab.orchestra
        self.rotation_index = (self.rotation_index + 1) % len(plan.rotation)
        target = set(plan.rotation[self.rotation_index]) | {s.name for s in self.slots.values() if s.pinned}
        up = [Candidate(s.name, tuple(s.gpus)) for s in self.slots.values() if s.state in UP]
        rest = [Candidate(s.name, tuple(s.gpus if s.state == "sleeping" else s.model.gpus), s.state == "sleeping")
                for s in self.slots.values() if s.state not in UP]
        moves = plan_moves(up, target, {s.name for s in self.slots.values() if s.pinned}, rest)
        started, problems = time.monotonic(), []

        async def run(task_factory: Callable[[], asyncio.Task | None]) -> None:
            try:
                task = task_factory()
                if task is not None:
                    await task
            except RemoteError as exc:
                problems.append(exc.message)

        for out, incoming in moves.swaps:
            await run(lambda: self.swap(self.slots[out], self.slots[incoming], rotation=True))
        for name in moves.out:
            slot = self.slots[name]
            await run(lambda: self._begin([slot], "sleep" if slot.engine and slot.engine.can_sleep else "cold", lambda: self._free(slot)))
        for name in moves.up:
            await run(lambda: self.warm(self.slots[name]))
        failed = [n for n in target if n in self.slots and self.slots[n].state != "warm"]
        duration_s = time.monotonic() - started
        self.unavailable_s += duration_s
        self.last_rotation = {
            "t": time.time(), "index": self.rotation_index, "duration_s": round(duration_s, 3),
            "swaps": moves.swaps, "out": moves.out, "up": moves.up, "not_warm": failed, "problems": problems,
        }
        self._kv_save(rotation_index=self.rotation_index, unavailable_s=self.unavailable_s, last_rotation=self.last_rotation)
        level = "warning" if failed or problems else "info"
        self._notice(level, f"rotation {self.rotation_index} on {self.agent.machine.name} took {duration_s:.1f} s"
                     + (f"; not warm: {', '.join(failed)}" if failed else ""))
        return self.last_rotation

    def _start_rotation(self) -> asyncio.Task:
        if self._rotation_task is not None and not self._rotation_task.done():
            raise RemoteError(ErrorCode.CONFLICT, "a rotation is running")
        self._rotation_task = asyncio.get_running_loop().create_task(self.rotate(), name="rotation")
        return self._rotation_task

    async def _bring_up_plan(self) -> None:
        """At start: pre-read `cached`, bring up `warm` (or the plan's current set) and pins, then `sleeping`."""
        await self._sampled.wait()
        plan = self.agent.lab.orchestra
        warm = set(plan.rotation[self.rotation_index % len(plan.rotation)] if plan.rotation and self.rotation_index >= 0 else plan.warm)
        warm |= {s.name for s in self.slots.values() if s.pinned}
        mine = lambda names: [self.slots[n] for n in names if n in self.slots]  # noqa: E731
        for slot in mine(plan.cached):
            await self._try(slot, lambda: self.cache(slot))
        await asyncio.gather(*(self._try(s, lambda s=s: self.warm(s)) for s in mine(sorted(warm))))
        await asyncio.gather(*(self._try(s, lambda s=s: self.warm(s)) for s in mine(plan.sleeping) if s.name not in warm))
        for slot in mine(plan.sleeping):
            if slot.name not in warm and slot.state == "warm":
                await self._try(slot, lambda: self.sleep(slot))

    async def _try(self, slot: Slot, step: Callable[[], Any]) -> None:
        """Run a start-up step; a model that cannot come up is reported, the rest go on."""
        try:
            task = step()
            if asyncio.iscoroutine(task):
                task = await task
            if task is not None:
                await task
        except RemoteError as exc:
            log.warning("start-up plan: %s: %s", slot.name, exc.message)
            self._notice("warning", f"{slot.name}: {exc.message}")

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        last_residency = 0.0
        while True:
            await asyncio.sleep(METRICS_EVERY_S)
            try:
                await asyncio.gather(*(self._poll(s) for s in self.slots.values() if s.state == "warm" and s.engine is not None))
                if time.monotonic() - last_residency >= RESIDENCY_EVERY_S:
                    last_residency = time.monotonic()
                    await asyncio.to_thread(self._measure_all)
                    for slot in self.slots.values():
                        if slot.state in ("cold", "cached") and not slot.busy:
                            self._set_state(slot, self._rest_state(slot))
                if self.next_rotation_at is not None and time.time() >= self.next_rotation_at:
                    self.next_rotation_at = time.time() + self.agent.lab.orchestra.rotate_every
                    self._kv_save(next_rotation_at=self.next_rotation_at)
                    if self._rotation_task is None or self._rotation_task.done():
                        self._start_rotation()
            except Exception:
                log.exception("orchestra loop")

    async def _poll(self, slot: Slot) -> None:
        engine = slot.engine
        try:
            figures = await engine.metrics()
        except (EngineDown, EngineRequestFailed):
            return  # the supervisor notices a dead engine; a slow one just misses a poll
        if not figures or slot.engine is not engine or slot.state != "warm":
            return
        now = time.monotonic()
        generated = figures.get("generation_tokens_total")
        if generated is not None and slot._tokens is not None and now > slot._tokens[0]:
            figures["tokens_per_s"] = round(max(0.0, generated - slot._tokens[1]) / (now - slot._tokens[0]), 1)
        else:
            figures["tokens_per_s"] = slot.metrics.get("tokens_per_s")
        if generated is not None:
            slot._tokens = (now, generated)
        count, total = figures.get("ttft_count"), figures.get("ttft_sum_s")
        figures["ttft_s"] = round(total / count, 3) if count and total is not None else None
        slot.metrics = figures
        running = figures.get("requests_running") or 0
        self._claim(slot, min(100.0, 10.0 + 85.0 * running / MAX_SEQS_FOR_UTIL))

    # ------------------------------------------------------------------ RPC

    def _register(self, agent: Agent) -> None:
        rpc = agent.rpc

        @rpc.method("models.list", doc="Every model of this machine with its state and figures, and the rotation plan.")
        async def models_list(peer, _params) -> dict:
            return {"machine": agent.machine.name, **(self.section() or {"models": [], "rotation": None})}

        @rpc.method("models.get", params=ModelParams, doc="One model with its history, load phases and log tail.")
        async def models_get(peer, params: ModelParams) -> dict:
            slot = self._slot(params.model)
            engine = slot.engine or slot.last_engine
            history = agent.store.query(
                "SELECT t, event, from_state, to_state, duration_s, detail FROM model_events WHERE model=? ORDER BY id DESC LIMIT 50",
                (slot.name,))
            swaps = agent.store.query(
                "SELECT t, out_model, in_model, free_s, bring_up_s, total_s, engine_s, rotation FROM model_swaps "
                "WHERE out_model=? OR in_model=? ORDER BY id DESC LIMIT 20", (slot.name, slot.name))
            return {
                **self._json(slot),
                "path": str(slot.path),
                "history": [{**r, "detail": json.loads(r["detail"]) if r["detail"] else None} for r in history],
                "swaps": swaps,
                "load_phases": engine.load_phases() if engine else {},
                "log_tail": engine.log_tail(40) if engine else [],
                "log_path": str(engine.log_path) if engine else None,
            }

        @rpc.method("models.warm", role=Role.OPERATOR, params=ModelParams, doc="Bring a model up (or wake it); returns at once.")
        async def models_warm(peer, params: ModelParams) -> dict:
            slot = self._slot(params.model)
            self.warm(slot)
            return self._json(slot)

        @rpc.method("models.sleep", role=Role.OPERATOR, params=ModelParams, doc="Put a warm model to sleep (GPU freed, weights in RAM).")
        async def models_sleep(peer, params: ModelParams) -> dict:
            slot = self._slot(params.model)
            self.sleep(slot)
            return self._json(slot)

        @rpc.method("models.cold", role=Role.OPERATOR, params=ModelParams, doc="Stop a model's engine; waits until it is stopped.")
        async def models_cold(peer, params: ModelParams) -> dict:
            slot = self._slot(params.model)
            await self.cold(slot)
            return self._json(slot)

        @rpc.method("models.swap", role=Role.OPERATOR, params=SwapParams, doc="Free OUT's GPUs and bring IN up there; returns at once.")
        async def models_swap(peer, params: SwapParams) -> dict:
            out, incoming = self._slot(params.out), self._slot(params.in_)
            self.swap(out, incoming)
            return {"out": self._json(out), "in": self._json(incoming)}

        @rpc.method("models.cache", role=Role.OPERATOR, params=ModelParams, doc="Pre-read a model's files into RAM (page cache).")
        async def models_cache(peer, params: ModelParams) -> dict:
            slot = self._slot(params.model)
            await self.cache(slot)
            return self._json(slot)

        @rpc.method("models.pin", role=Role.OPERATOR, params=PinParams, doc="Pin (or unpin) a model: rotation never takes it out.")
        async def models_pin(peer, params: PinParams) -> dict:
            slot = self._slot(params.model)
            slot.pinned = params.pinned
            self._kv_save(pins={s.name: s.pinned for s in self.slots.values()})
            return self._json(slot)

        @rpc.method("models.rotation", doc="The rotation plan, the next rotation time and the measured overhead.")
        async def models_rotation(peer, _params) -> dict:
            return self._rotation_json()

        @rpc.method("models.rotate", role=Role.OPERATOR, doc="Run the next rotation of the plan now; returns at once.")
        async def models_rotate(peer, _params) -> dict:
            if not agent.lab.orchestra.rotation:
                raise RemoteError(ErrorCode.UNAVAILABLE, "lab.yaml has no orchestra.rotation plan")
            self._start_rotation()
            await asyncio.sleep(0)
            return self._rotation_json()

        @rpc.method("models.adapter", role=Role.OPERATOR, params=AdapterParams, doc="Load a LoRA adapter into a warm vLLM (or sim) model.")
        async def models_adapter(peer, params: AdapterParams) -> dict:
            slot = self._slot(params.model)
            path = agent.lab.resolve(params.path)
            if not (path / "adapter_config.json").is_file():
                raise RemoteError(ErrorCode.NOT_FOUND, f"{path} is not a LoRA adapter folder (no adapter_config.json) on {agent.machine.name}")
            if slot.state != "warm" or slot.engine is None or not hasattr(slot.engine, "load_adapter"):
                raise RemoteError(ErrorCode.CONFLICT, f"{slot.name} is {slot.state} on the {slot.model.engine} engine; adapters load into a warm vllm model")
            try:
                await slot.engine.load_adapter(params.name, str(path))
            except (EngineDown, EngineRequestFailed) as exc:
                raise RemoteError(ErrorCode.UNAVAILABLE, f"{slot.name} refused the adapter: {exc}") from None
            self._event(slot, "adapter", detail={"name": params.name, "path": str(path)})
            return {**self._json(slot), "adapter": params.name}
