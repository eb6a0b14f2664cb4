"""The models.* methods and their params."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

from agents.orchestra.engine import EngineDown, EngineRequestFailed
from agents.orchestra.engines import engine_spec
from agents.runtime.rpc import Peer
from agents.wire.catalogue.method import NoParams
from agents.wire.catalogue.models import (
    MODELS_ADAPTER,
    MODELS_CACHE,
    MODELS_COLD,
    MODELS_GET,
    MODELS_LIST,
    MODELS_PIN,
    MODELS_ROTATE,
    MODELS_ROTATION,
    MODELS_SLEEP,
    MODELS_SWAP,
    MODELS_WARM,
    AdapterLoaded,
    AdapterParams,
    ModelDetail,
    ModelEvent,
    ModelParams,
    ModelsList,
    PinParams,
    SwapParams,
    SwapRecord,
    SwapResult,
)
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import ModelInfo, Rotation
from agents.wire.states import ModelState

if TYPE_CHECKING:
    from agents.orchestra.component import OrchestraComponent
    from agents.runtime.rpc import Peer


def register(pool: OrchestraComponent) -> None:
    """The models.* methods, on the pool's public interface.

    Over 80 lines: one closure per method, each a few lines, registered in the catalogue's order."""
    core = pool.core
    rpc = core.rpc

    @rpc.implements(MODELS_LIST)
    async def models_list(peer: Peer, _params: NoParams) -> ModelsList:
        section = pool.section()
        if section is None:
            return ModelsList(machine=core.machine.name, models=[], rotation=None)
        return ModelsList(machine=core.machine.name, models=section.models, rotation=section.rotation)

    @rpc.implements(MODELS_GET)
    async def models_get(peer: Peer, params: ModelParams) -> ModelDetail:
        slot = pool.slot(params.model)
        engine = slot.engine or slot.last_engine
        history = core.store.query(
            "SELECT t, event, from_state, to_state, duration_s, detail FROM model_events WHERE model=? ORDER BY id DESC LIMIT 50",
            (slot.name,),
        )
        swaps = core.store.query(
            "SELECT t, out_model, in_model, free_s, bring_up_s, total_s, engine_s, rotation FROM model_swaps "
            "WHERE out_model=? OR in_model=? ORDER BY id DESC LIMIT 20",
            (slot.name, slot.name),
        )
        return ModelDetail(
            **pool.info(slot).model_dump(),
            path=str(slot.path),
            history=[
                ModelEvent.model_validate({**r, "detail": json.loads(r["detail"]) if r["detail"] else None}) for r in history
            ],
            swaps=[SwapRecord.model_validate(r) for r in swaps],
            load_phases=engine.load_phases() if engine else {},
            log_tail=engine.log_tail(40) if engine else [],
            log_path=str(engine.log_path) if engine else None,
        )

    @rpc.implements(MODELS_WARM)
    async def models_warm(peer: Peer, params: ModelParams) -> ModelInfo:
        slot = pool.slot(params.model)
        pool.warm(slot)
        slot.operator_warm = True
        return pool.info(slot)

    @rpc.implements(MODELS_SLEEP)
    async def models_sleep(peer: Peer, params: ModelParams) -> ModelInfo:
        slot = pool.slot(params.model)
        pool.sleep(slot)
        slot.operator_warm = False
        return pool.info(slot)

    @rpc.implements(MODELS_COLD)
    async def models_cold(peer: Peer, params: ModelParams) -> ModelInfo:
        slot = pool.slot(params.model)
        slot.operator_warm = False
        if pool.lifecycle.needs_drain(slot) and not slot.busy:
            pool.lifecycle.drain_and_stop(slot)  # a serving replica ends its requests first; ticks show the rest
            await asyncio.sleep(0)
        else:
            await pool.cold(slot)
        return pool.info(slot)

    @rpc.implements(MODELS_SWAP)
    async def models_swap(peer: Peer, params: SwapParams) -> SwapResult:
        out, incoming = pool.slot(params.out), pool.slot(params.in_)
        pool.swap(out, incoming)
        out.operator_warm, incoming.operator_warm = False, True
        return SwapResult.model_validate({"out": pool.info(out), "in": pool.info(incoming)})

    @rpc.implements(MODELS_CACHE)
    async def models_cache(peer: Peer, params: ModelParams) -> ModelInfo:
        slot = pool.slot(params.model)
        await pool.cache(slot)
        return pool.info(slot)

    @rpc.implements(MODELS_PIN)
    async def models_pin(peer: Peer, params: PinParams) -> ModelInfo:
        slot = pool.slot(params.model)
        slot.pinned = params.pinned
        pool.book.kv_save(pins={s.name: s.pinned for s in pool.slots.values()})
        return pool.info(slot)

    @rpc.implements(MODELS_ROTATION)
    async def models_rotation(peer: Peer, _params: NoParams) -> Rotation:
        return pool.rotation_info()

    @rpc.implements(MODELS_ROTATE)
    async def models_rotate(peer: Peer, _params: NoParams) -> Rotation:
        if not core.lab.orchestra.rotation:
            raise RemoteError(ErrorCode.UNAVAILABLE, "lab.yaml has no orchestra.rotation plan")
        pool.rotation.start()
        for slot in pool.slots.values():  # the operator's latest command wins: this rotation may take them out
            slot.operator_warm = False
        await asyncio.sleep(0)
        return pool.rotation_info()

    @rpc.implements(MODELS_ADAPTER)
    async def models_adapter(peer: Peer, params: AdapterParams) -> AdapterLoaded:
        slot = pool.slot(params.model)
        path = core.lab.resolve(params.path) or Path(params.path)
        if engine_spec(slot.model.engine).adapter_format == "gguf":  # llama.cpp: one GGUF adapter file, named at start
            if not (path.is_file() and path.suffix.lower() == ".gguf"):
                raise RemoteError(
                    ErrorCode.NOT_FOUND,
                    f"{path} is not a GGUF adapter file on {core.machine.name} "
                    f"({slot.name} runs llama.cpp, which takes --lora FILE.gguf)",
                )
        elif not (path / "adapter_config.json").is_file():
            raise RemoteError(
                ErrorCode.NOT_FOUND, f"{path} is not a LoRA adapter folder (no adapter_config.json) on {core.machine.name}"
            )
        if slot.state != ModelState.WARM or slot.engine is None or slot.engine.spec.adapter_format == "none":
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"{slot.name} is {slot.state} on the {slot.model.engine} engine; adapters load into a warm vllm model",
            )
        try:
            await slot.engine.load_adapter(params.name, str(path))
        except (EngineDown, EngineRequestFailed) as exc:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"{slot.name} refused the adapter: {exc}") from None
        pool.book.event(slot, "adapter", detail={"name": params.name, "path": str(path)})
        return AdapterLoaded(**pool.info(slot).model_dump(), adapter=params.name)
