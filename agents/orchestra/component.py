"""OrchestraComponent: the model pool on one machine, composed of its parts, its public interface and the metrics poll.

The parts, each built with what it uses: book.py (the slots and what is recorded of them), residency.py
(page cache), placement.py (VRAM fit), lifecycle.py (engines and operations), rotation.py (plans); and
beside them slot.py (one model), adopt.py (engines left running by a previous agent), methods.py (models.* RPC).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agents.orchestra import engine, spread
from agents.orchestra.adopt import adopt, found_on_disk
from agents.orchestra.book import PoolBook
from agents.orchestra.engine import EngineDown, EngineRequestFailed
from agents.orchestra.engines import engine_class, engine_spec, installed_stacks
from agents.orchestra.engines.llamacpp.engine import convert_lora_argv, converter_env
from agents.orchestra.engines.vllm.engine import adapter_problem
from agents.orchestra.lifecycle import Lifecycle
from agents.orchestra.methods import register
from agents.orchestra.placement import Placement
from agents.orchestra.port import LoraConversion, ModelView
from agents.orchestra.residency import Residency
from agents.orchestra.rotation import Rotation, rotation_run
from agents.orchestra.slot import TOKENS_PER_S_WINDOW_S, Slot
from agents.orchestra.spec import EngineSpec
from agents.orchestra.spread import RpcServers
from agents.runtime.core import AgentCore
from agents.runtime.hooks import Hooks
from agents.runtime.stopping import STOP_DEADLINE_S
from agents.runtime.torch_probe import TorchReader
from agents.wire.documents import EngineFigures
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import Lab, Model
from agents.wire.lab.replicas import machines_of, models_on
from agents.wire.protocol import ErrorCode, RemoteError, Telemetry
from agents.wire.sections.gpu_support import Stack, StackKind
from agents.wire.sections.models import ModelInfo, ModelsSection
from agents.wire.sections.models import Rotation as RotationInfo
from agents.wire.states import MODEL_AT_REST, MODEL_ENGINE_UP, MODEL_HOLDS_GPU, ModelState

log = logging.getLogger("cetlab.orchestra")

METRICS_EVERY_S = 2.0
RESIDENCY_EVERY_S = 5.0
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


class OrchestraComponent(Hooks):
    """The agent's model pool: the models whose machine is this one (ModelsPort, agents/orchestra/port.py)."""

    name = "models"
    stop_grace_s = engine.STOP_GRACE_S + spread.STOP_GRACE_S + STOP_DEADLINE_S  # engines in parallel, then a spread's parts

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.book = PoolBook(core)
        self.slots = self.book.slots  # the same dict: the pool owns its slots, its parts share them
        self.residency = Residency(core, self.book)
        self.placement = Placement(core, self.slots)
        self.lifecycle = Lifecycle(core, self.book, self.residency, self.placement)
        self.rotation = Rotation(core, self.book, self.lifecycle)
        self.rpc_servers = RpcServers(core, self.placement)  # the rpc-servers of models other machines spread over this one
        self._tasks: list[asyncio.Task[None]] = []
        pinned = set(core.lab.orchestra.pinned)
        for model in models_on(core.lab, core.machine.name):  # a replica of a model: as placed here
            self.slots[model.name] = Slot(
                model, core.lab.resolve(model.path) or Path(model.path), list(model.gpus), pinned=model.name in pinned
            )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        core, book, rotation = self.core, self.book, self.rotation
        core.store.migrate(self.name, SCHEMA)
        kv = {row["key"]: json.loads(row["value"]) for row in core.store.query("SELECT key, value FROM orchestra_kv")}
        for name, value in (kv.get("pins") or {}).items():
            if name in self.slots:
                self.slots[name].pinned = value
        book.since = kv.get("since") or time.time()
        book.unavailable_s = kv.get("unavailable_s") or 0.0
        rotation.index = kv.get("rotation_index", -1)
        rotation.last = rotation_run(kv.get("last_rotation"))
        book.kv_save(since=book.since)
        for slot in self.slots.values():
            for row in core.store.query(
                "SELECT event, duration_s FROM model_events WHERE model=? AND event IN ('load','warmup','wake','swap','cache') "
                "AND id IN (SELECT MAX(id) FROM model_events WHERE model=? GROUP BY event)",
                (slot.name, slot.name),
            ):
                slot.timings[f"{row['event']}_s"] = row["duration_s"]
        await asyncio.to_thread(self.residency.make_placeholders)
        await asyncio.to_thread(self.residency.measure_all)
        await asyncio.to_thread(self.estimate_needs, list(self.slots.values()))
        for slot in self.slots.values():
            slot.state = self.residency.rest_state(slot)
        engines = kv.get("engines")
        if engines is None:  # never recorded here: a first start, or a state.db lost (deleted, or corrupt and moved aside)
            engines = found_on_disk(core.state_dir / "models")
        await adopt(self.lifecycle, engines or {})  # what a previous agent left running (systemd restart, crash)
        register(self)
        self.rpc_servers.register()
        await self.lifecycle.spread.start(lambda: list(self.slots.values()))
        if self.slots:
            plan = core.lab.orchestra
            if plan.rotate_every and plan.rotation:
                rotation.next_at = kv.get("next_rotation_at") or time.time() + plan.rotate_every
            self._tasks.append(asyncio.create_task(self._loop(), name="orchestra"))
            self._tasks.append(asyncio.create_task(rotation.bring_up_plan(), name="orchestra-start"))

    async def stop(self) -> None:
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self.lifecycle.supervisors]
        for task in tasks:
            task.cancel()
        if self.rotation.task is not None:
            self.rotation.task.cancel()
        ops = [s.op for s in self.slots.values() if s.op is not None and s.busy]
        for op in ops:
            op.cancel()
        await asyncio.gather(*tasks, *ops, return_exceptions=True)
        # else they keep serving and the next agent re-adopts them; a spread model's llama-server is never kept: it
        # reaches its helpers' rpc-servers through this agent's SSH forwards, which end with it
        ending = [s for s in self.slots.values() if not self.core.keep_engines or s.model.rpc]
        await asyncio.gather(*(s.engine.stop() for s in ending if s.engine), return_exceptions=True)
        await asyncio.gather(*(self.lifecycle.spread.take_down(s) for s in ending if s.model.rpc), return_exceptions=True)
        await self.lifecycle.spread.stop()
        await self.rpc_servers.stop_all()  # never kept: the model's machine starts them again with its engine
        for slot in self.slots.values():
            self.core.release_gpus(f"model:{slot.name}")

    async def reconfigure(self, old: Lab, new: Lab) -> None:
        """A pushed lab.yaml, live: a model gone is stopped and dropped, a new one gets its slot (cold, or cached), and a
        kept model takes its new entry for its next start; its warm engine keeps serving as it is, on its GPUs."""
        core = self.core
        here = {m.name: m for m in models_on(new, core.machine.name)}
        for name in [n for n in self.slots if n not in here]:
            await self.lifecycle.cold(self.slots[name])
            core.release_gpus(f"model:{name}")
            del self.slots[name]
        self.rpc_servers.reload()
        pinned, was_pinned = set(new.orchestra.pinned), set(old.orchestra.pinned)
        added, rested, changed = [], [], []
        for name, model in here.items():
            path = new.resolve(model.path)
            slot = self.slots.get(name)
            if slot is None:
                slot = self.slots[name] = Slot(model, path, list(model.gpus), pinned=name in pinned)
                added.append(slot)
                continue
            if slot.model != model or slot.path != path:
                changed.append(slot)
            if slot.engine is None and not slot.busy and (slot.model != model or slot.path != path):
                rested.append(slot)  # changed while at rest: its placeholder and residency judged again below
            slot.model, slot.path = model, path
            if slot.engine is None and not slot.busy:
                slot.gpus = list(model.gpus)
            if (name in pinned) != (name in was_pinned):  # lab.yaml's pins changed: they win over `cetlab pin` here
                slot.pinned = name in pinned
        if added or rested:
            await asyncio.to_thread(self.residency.make_placeholders)
            await asyncio.to_thread(self.residency.measure_all)
            for slot in added + rested:
                slot.state = self.residency.rest_state(slot)
        if added or changed:  # after the placeholders: a demo model's file is there to read
            await asyncio.to_thread(self.estimate_needs, [*added, *changed])
        if self.slots and not self._tasks:  # the first models of a machine that had none
            self._tasks.append(asyncio.create_task(self._loop(), name="orchestra"))

    def on_telemetry(self, telemetry: Telemetry) -> None:
        self.placement.observe(telemetry)

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
        elsewhere = next((machines_of(m) for m in self.core.lab.models if m.name == name), None)
        if elsewhere is not None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"{name} runs on {' and '.join(elsewhere)}, not {self.core.machine.name}")
        raise RemoteError(
            ErrorCode.NOT_FOUND,
            f"no model named {name!r} on {self.core.machine.name} (models here: {', '.join(self.slots) or 'none'})",
        )

    # ------------------------------------------------------------------ ModelsPort: what other components ask (port.py)

    @staticmethod
    def _view(slot: Slot) -> ModelView:
        engine = slot.engine
        return ModelView(
            name=slot.name,
            model=slot.model,
            path=slot.path,
            state=slot.state,
            busy=slot.busy,
            spec=engine_spec(slot.model.engine),
            engine_serial=engine.serial if engine is not None else None,
            endpoint=engine.endpoint if engine is not None else None,
            error=slot.error,
        )

    def view(self, name: str) -> ModelView:
        return self._view(self.slot(name))

    def find_view(self, name: str) -> ModelView | None:
        slot = self.slots.get(name)
        return None if slot is None else self._view(slot)

    def engine_spec(self, engine: str) -> EngineSpec:
        return engine_spec(engine)

    def engine_stack_kind(self, engine: str) -> StackKind | None:
        return engine_spec(engine).gpu_stack

    def engine_stack(self, engine: str, reader: TorchReader) -> Stack | None:
        return engine_class(engine).stack(reader)

    def engine_stacks(self, reader: TorchReader) -> list[Stack]:
        return installed_stacks(reader)

    def adapter_problem(self, name: str, adapter_dir: Path) -> str | None:
        return adapter_problem(adapter_dir, self.slot(name).model)

    async def load_adapter(self, name: str, adapter: str, path: str) -> None:
        slot = self.slot(name)
        if slot.engine is None:
            raise RemoteError(
                ErrorCode.CONFLICT, f"{name} is {slot.state}; warm it first (`cetlab warm {name}`), then serve the adapter"
            )
        try:
            await slot.engine.load_adapter(adapter, path)
        except (EngineDown, EngineRequestFailed) as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{name} refused the adapter: {exc}") from None

    def lora_conversion(self, adapter: Path, base: Path, out: Path) -> LoraConversion | None:
        argv = convert_lora_argv(adapter, base, out)
        return None if argv is None else LoraConversion(argv=argv, env=converter_env(), out=out)

    async def bring_up(self, name: str) -> ModelView:
        slot = self.slot(name)
        task = self.lifecycle.warm(slot)
        if task is not None:
            await task
        return self._view(slot)

    def _engine_addresses(self) -> list[EngineAddress]:
        return [
            s.engine.address
            for s in self.slots.values()
            if s.engine is not None and s.state in MODEL_ENGINE_UP and s.engine.returncode is None
        ]

    def engine_ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports of the engines running here now (lab.yaml's port:, or a server with no socket option):
        with engine_sockets, the only places the gateway may reach over SSH."""
        return frozenset(a.port for a in self._engine_addresses() if a.port is not None)

    def engine_sockets(self) -> frozenset[str]:
        """The unix sockets of the engines running here now (in the agent's own 0700 folders)."""
        return frozenset(a.socket for a in self._engine_addresses() if a.socket is not None)

    def rpc_ports(self) -> frozenset[int]:
        return self.rpc_servers.ports()

    def holding_gpus(self) -> list[ModelInfo]:
        """The models that occupy their GPUs now (a sleeping vLLM engine has given them back)."""
        return [self.info(s) for s in self.slots.values() if s.state in MODEL_HOLDS_GPU]

    def adapter_host(self, base: Path) -> ModelView | None:
        """A warm model whose engine loads LoRA adapters at run time and whose weights are ``base``."""
        base = base.resolve()
        for slot in self.slots.values():
            if slot.state == ModelState.WARM and engine_spec(slot.model.engine).hot_adapters and slot.path.resolve() == base:
                return self._view(slot)
        return None

    def add_model(self, model: Model, path: Path) -> ModelView:
        """A model made at run time (a checkpoint served as a model), from now on part of the pool."""
        if model.name in self.slots:
            raise RemoteError(ErrorCode.CONFLICT, f"{model.name} is already a model of {self.core.machine.name}")
        slot = self.slots[model.name] = Slot(model, path, list(model.gpus))
        slot.estimate_need()  # headers only: a GGUF's or each shard's, bounded
        return self._view(slot)

    def remove_model(self, name: str) -> None:
        """Forget a model made at run time (it must be at rest); lab.yaml's models stay."""
        slot = self.slots.get(name)
        if slot is not None and (slot.busy or slot.state not in MODEL_AT_REST | {ModelState.FAILED}):
            raise RemoteError(ErrorCode.CONFLICT, f"{name} is {slot.state}; stop it first")
        self.slots.pop(name, None)

    @staticmethod
    def estimate_needs(slots: list[Slot]) -> None:
        """Each slot's VRAM need from its files where lab.yaml gives none (reads headers: run it in a thread)."""
        for slot in slots:
            slot.estimate_need()

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
            vram_need_bytes=slot.need.bytes,
            vram_source=slot.need.source,
            vram_detail=slot.need.detail,
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
            draining=slot.draining,
            can_sleep=engine_spec(slot.model.engine).can_sleep,
            op=slot.op_name if slot.busy else None,
            progress=slot.progress,
            error=slot.error,
            cloud_equivalent=slot.model.cloud_equivalent,
            simulated=engine_spec(slot.model.engine).simulated,
            helpers=[h.machine for h in slot.model.rpc],
        )

    def rotation_info(self) -> RotationInfo:
        plan = self.core.lab.orchestra
        rotation, unavailable_s = self.rotation, self.book.unavailable_s
        wall_s = max(1e-9, time.time() - self.book.since)
        sets = plan.rotation
        return RotationInfo(
            plan=sets,
            every_s=plan.rotate_every,
            index=rotation.index if sets and rotation.index >= 0 else None,
            next_set=sets[(rotation.index + 1) % len(sets)] if sets else None,
            next_at=rotation.next_at,
            running=rotation.running,
            pinned=sorted(s.name for s in self.slots.values() if s.pinned),
            unavailable_s=round(unavailable_s, 3),
            wall_s=round(wall_s, 1),
            overhead_pct=round(100 * unavailable_s / wall_s, 4),
            target_pct=OVERHEAD_TARGET_PCT,
            last=rotation.last,
        )

    # ------------------------------------------------------------------ operations (the lifecycle's, for methods and ports)

    def warm(self, slot: Slot) -> asyncio.Task[Any] | None:
        return self.lifecycle.warm(slot)

    def sleep(self, slot: Slot) -> asyncio.Task[Any] | None:
        return self.lifecycle.sleep(slot)

    async def cold(self, slot: Slot) -> None:
        await self.lifecycle.cold(slot)

    def swap(self, out: Slot, incoming: Slot) -> asyncio.Task[Any]:
        return self.lifecycle.swap(out, incoming)

    async def cache(self, slot: Slot) -> asyncio.Task[Any]:
        return await self.lifecycle.cache(slot)

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        last_residency = 0.0
        while True:
            await asyncio.sleep(METRICS_EVERY_S)
            try:
                await asyncio.gather(
                    *(self._poll(s) for s in self.slots.values() if s.state == ModelState.WARM and s.engine is not None)
                )
                if time.monotonic() - last_residency >= RESIDENCY_EVERY_S:
                    last_residency = time.monotonic()
                    await asyncio.to_thread(self.residency.measure_all)
                    # files replaced or arrived since: their estimate again (a stat each when nothing changed)
                    await asyncio.to_thread(self.estimate_needs, [s for s in self.slots.values() if s.model.vram_gib is None])
                    for slot in self.slots.values():
                        if slot.state in MODEL_AT_REST and not slot.busy:
                            self.book.set_state(slot, self.residency.rest_state(slot))
                rotation = self.rotation
                if rotation.next_at is not None and time.time() >= rotation.next_at and rotation.plan_done:
                    every = self.core.lab.orchestra.rotate_every
                    rotation.next_at = time.time() + every if every else None
                    self.book.kv_save(next_rotation_at=rotation.next_at)
                    if not rotation.running:
                        rotation.start()
            except Exception:
                log.exception("orchestra loop")

    async def _poll(self, slot: Slot) -> None:
        engine = slot.engine
        if engine is None:
            return
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
        self.book.claim(slot, min(100.0, 10.0 + 85.0 * running / MAX_SEQS_FOR_UTIL))
