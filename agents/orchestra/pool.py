"""OrchestraComponent: the model pool on one machine: its state, its public interface, bookkeeping and the metrics poll.

The pool's other jobs live beside it: slot.py (one model), lifecycle.py (engines and operations),
residency.py (page cache), placement.py (VRAM fit), rotation.py (plans), adopt.py (engines left
running by a previous agent), methods.py (models.* RPC).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agents.documents import EngineFigures
from agents.lab import Model
from agents.orchestra.adopt import adopt, found_on_disk, keep_on_disk, remember
from agents.orchestra.engine import EngineDown, EngineRequestFailed
from agents.orchestra.lifecycle import LifecycleMixin
from agents.orchestra.methods import register
from agents.orchestra.placement import PlacementMixin
from agents.orchestra.residency import ResidencyMixin
from agents.orchestra.rotation import RotationMixin
from agents.orchestra.engines import engine_spec
from agents.orchestra.slot import TOKENS_PER_S_WINDOW_S, Slot, WindowRate
from agents.protocol import EVENT_NOTICE, ErrorCode, RemoteError, Telemetry
from agents.sections import ModelInfo, ModelsSection, Rotation
from agents.states import MODEL_AT_REST, MODEL_ENGINE_UP, MODEL_HOLDS_GPU, ModelState

if TYPE_CHECKING:
    from agents.agent import Agent

log = logging.getLogger("cetlab.orchestra")

METRICS_EVERY_S = 2.0
RESIDENCY_EVERY_S = 5.0
OVERHEAD_TARGET_PCT = 1.0
MAX_SEQS_FOR_UTIL = 8  # requests at which a simulated GPU shows full load
SIM_UTIL_PCT = {ModelState.LOADING: 25.0, ModelState.WARMING: 95.0, ModelState.WARM: 10.0}  # a simulated GPU's load by state

SCHEMA = [
    """CREATE TABLE model_events (id INTEGER PRIMARY KEY, t REAL NOT NULL, model TEXT NOT NULL, event TEXT NOT NULL,
       from_state TEXT, to_state TEXT, duration_s REAL, detail TEXT)""",
    "CREATE INDEX model_events_by_model ON model_events(model, t)",
    """CREATE TABLE model_swaps (id INTEGER PRIMARY KEY, t REAL NOT NULL, out_model TEXT NOT NULL, in_model TEXT NOT NULL,
       free_s REAL, bring_up_s REAL, total_s REAL, engine_s REAL, rotation INTEGER NOT NULL DEFAULT 0)""",
    "CREATE TABLE orchestra_kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]


class OrchestraComponent(LifecycleMixin, ResidencyMixin, PlacementMixin, RotationMixin):
    """The agent's model pool: the models whose machine is this one."""

    name = "models"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.slots: dict[str, Slot] = {}
        self._tasks: list[asyncio.Task] = []
        self._held_at_sample: dict[str, tuple[tuple[int, ...], dict[int, int], bool]] = {}
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
        engines = kv.get("engines")
        if engines is None:  # never recorded here: a first start, or a state.db lost (deleted, or corrupt and moved aside)
            engines = found_on_disk(self.agent.state_dir / "models")
        await adopt(self, engines or {})  # what a previous agent left running (systemd restart, crash)
        register(self)
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
        for s in self.slots.values():  # a loading model is still growing: it keeps its estimate until it is up
            measurable = nvml and s.engine is not None and s.state in MODEL_ENGINE_UP and s.state != ModelState.LOADING
            s.measured = s.engine.vram_by_gpu(telemetry.gpus) if measurable else None
        self._held_at_sample = {
            s.name: (tuple(s.gpus), {i: s.held_bytes(i) for i in s.gpus}, nvml and s.state == ModelState.LOADING)
            for s in self.slots.values()
        }
        self._sampled.set()

    def section(self) -> ModelsSection | None:
        if not self.slots:
            return None
        return ModelsSection(models=[self.info(s) for s in self.slots.values()], rotation=self.rotation_info())

    # ------------------------------------------------------------------ the public interface of the pool

    def slot(self, name: str) -> Slot:
        """The model of that name on this machine; NOT_FOUND (saying where it runs, if elsewhere) when it is not here."""
        slot = self.slots.get(name)
        if slot is not None:
            return slot
        elsewhere = next((m.machine for m in self.agent.lab.models if m.name == name), None)
        if elsewhere is not None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"{name} runs on {elsewhere}, not {self.agent.machine.name}")
        raise RemoteError(ErrorCode.NOT_FOUND, f"no model named {name!r} on {self.agent.machine.name} (models here: {', '.join(self.slots) or 'none'})")

    def find(self, name: str) -> Slot | None:
        return self.slots.get(name)

    def engine_ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports of the engines running here now: the only ones the gateway may reach over SSH."""
        return frozenset(s.engine.port for s in self.slots.values()
                         if s.engine is not None and s.state in MODEL_ENGINE_UP and s.engine.returncode is None)

    def holding_gpus(self) -> list[ModelInfo]:
        """The models that occupy their GPUs now (a sleeping vLLM engine has given them back)."""
        return [self.info(s) for s in self.slots.values() if s.state in MODEL_HOLDS_GPU]

    def adapter_host(self, base: Path) -> Slot | None:
        """A warm model whose engine loads LoRA adapters at run time and whose weights are ``base``."""
        base = base.resolve()
        for slot in self.slots.values():
            if slot.state == ModelState.WARM and engine_spec(slot.model.engine).hot_adapters and slot.path.resolve() == base:
                return slot
        return None

    def add_model(self, model: Model, path: Path) -> Slot:
        """A model made at run time (a checkpoint served as a model), from now on part of the pool."""
        if model.name in self.slots:
            raise RemoteError(ErrorCode.CONFLICT, f"{model.name} is already a model of {self.agent.machine.name}")
        slot = self.slots[model.name] = Slot(model, path, list(model.gpus))
        return slot

    def remove_model(self, name: str) -> None:
        """Forget a model made at run time (it must be at rest); lab.yaml's models stay."""
        slot = self.slots.get(name)
        if slot is not None and (slot.busy or slot.state not in MODEL_AT_REST | {ModelState.FAILED}):
            raise RemoteError(ErrorCode.CONFLICT, f"{name} is {slot.state}; stop it first")
        self.slots.pop(name, None)

    # ------------------------------------------------------------------ sections

    def info(self, slot: Slot) -> ModelInfo:
        m = slot.metrics
        engine = slot.engine
        return ModelInfo(
            name=slot.name,
            machine=slot.model.machine,
            engine=slot.model.engine,
            state=slot.state,
            since=round(slot.since, 3),
            gpus=slot.gpus,
            vram_bytes=slot.vram_bytes(),
            vram_measured=slot.measured is not None,
            cached_fraction=slot.cached_fraction,
            size_bytes=slot.size_bytes,
            load_s=slot.timings.get("load_s"),
            warmup_s=slot.timings.get("warmup_s"),
            wake_s=slot.timings.get("wake_s"),
            swap_s=slot.timings.get("swap_s"),
            requests_running=m.requests_running,
            requests_waiting=m.requests_waiting,
            tokens_per_s=slot.tokens_per_s,
            tokens_per_s_window_s=TOKENS_PER_S_WINDOW_S,
            kv_cache_pct=m.kv_cache_pct,
            ttft_s=m.ttft_s,
            prompt_tokens_total=m.prompt_tokens_total,
            generation_tokens_total=m.generation_tokens_total,
            endpoint=engine.endpoint if engine is not None else None,
            served_name=engine.served_name if engine is not None else (slot.model.served_name or slot.model.name),
            adapters=sorted(engine.adapters) if engine is not None else [],
            pinned=slot.pinned,
            op=slot.op_name if slot.busy else None,
            progress=slot.progress,
            error=slot.error,
            cloud_equivalent=slot.model.cloud_equivalent,
            simulated=engine_spec(slot.model.engine).simulated,
        )

    def rotation_info(self) -> Rotation:
        plan = self.agent.lab.orchestra
        wall_s = max(1e-9, time.time() - self.since)
        sets = plan.rotation
        return Rotation(
            plan=sets,
            every_s=plan.rotate_every,
            index=self.rotation_index if sets and self.rotation_index >= 0 else None,
            next_set=sets[(self.rotation_index + 1) % len(sets)] if sets else None,
            next_at=self.next_rotation_at,
            running=self._rotation_task is not None and not self._rotation_task.done(),
            pinned=sorted(s.name for s in self.slots.values() if s.pinned),
            unavailable_s=round(self.unavailable_s, 3),
            wall_s=round(wall_s, 1),
            overhead_pct=round(100 * self.unavailable_s / wall_s, 4),
            target_pct=OVERHEAD_TARGET_PCT,
            last=self.last_rotation,
        )

    # ------------------------------------------------------------------ bookkeeping

    def remember_engines(self) -> None:
        """The running engines, in state.db and in the models folder: a restarted agent re-adopts them."""
        running = remember(self.slots)
        self._kv_save(engines=running)
        keep_on_disk(self.agent.state_dir / "models", running)

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
        slot.measured = None  # e.g. a sleeping vLLM's residual: taken from the next sample, the estimate until then
        if state in MODEL_ENGINE_UP:
            slot.last_used = now
        if state != ModelState.WARM:
            slot.metrics, slot.tokens_per_s, slot.token_rate = EngineFigures(), None, WindowRate(TOKENS_PER_S_WINDOW_S)
        self._claim(slot)
        self.remember_engines()

    def _claim(self, slot: Slot, util_pct: float | None = None) -> None:
        """Show the model on simulated GPUs (NVML machines see the real process)."""
        key = f"model:{slot.name}"
        held = slot.held_bytes()
        if not held:
            self.agent.release_gpus(key)
            return
        if util_pct is None:
            util_pct = SIM_UTIL_PCT.get(slot.state, 0.0)
        pid = slot.engine.pid if slot.engine and slot.engine.pid else 0
        self.agent.claim_gpus(slot.gpus, key, f"model {slot.name} ({slot.model.engine})", held, util_pct, pid)

    def _notice(self, level: str, message: str) -> None:
        self.agent.notify(EVENT_NOTICE, {"level": level, "message": message, "machine": self.agent.machine.name})

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        last_residency = 0.0
        while True:
            await asyncio.sleep(METRICS_EVERY_S)
            try:
                await asyncio.gather(*(self._poll(s) for s in self.slots.values() if s.state == ModelState.WARM and s.engine is not None))
                if time.monotonic() - last_residency >= RESIDENCY_EVERY_S:
                    last_residency = time.monotonic()
                    await asyncio.to_thread(self._measure_all)
                    for slot in self.slots.values():
                        if slot.state in MODEL_AT_REST and not slot.busy:
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
            figures = EngineFigures.model_validate(await engine.metrics())
        except (EngineDown, EngineRequestFailed):
            return  # the supervisor notices a dead engine; a slow one just misses a poll
        except (ValueError, ValidationError) as exc:  # a page that is not Prometheus text, or figures that are not numbers
            log.warning("%s: unreadable /metrics: %s", slot.name, exc)
            return
        if slot.engine is not engine or slot.state != ModelState.WARM:
            return
        generated = figures.generation_tokens_total
        if generated is not None:
            rate = slot.token_rate.add(time.monotonic(), generated)
            slot.tokens_per_s = None if rate is None else round(rate, 1)
        slot.metrics = figures
        running = figures.requests_running or 0
        self._claim(slot, min(100.0, 10.0 + 85.0 * running / MAX_SEQS_FOR_UTIL))
