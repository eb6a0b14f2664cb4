"""The models.* methods and their params."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.orchestra.engine import EngineDown, EngineRequestFailed
from agents.orchestra.engines import engine_spec
from agents.wire.catalogue.models import AdapterParams, ModelParams, PinParams, SwapParams
from agents.wire.protocol import ErrorCode, RemoteError, Role
from agents.wire.states import ModelState

if TYPE_CHECKING:
    from agents.orchestra.component import OrchestraComponent
    from agents.runtime.rpc import Peer


def register(pool: OrchestraComponent) -> None:
    """The models.* methods, on the pool's public interface."""
    core = pool.core
    rpc = core.rpc

    @rpc.method("models.list", doc="Every model of this machine with its state and figures, and the rotation plan.")
    async def models_list(peer: Peer, _params: Any) -> dict[str, Any]:
        section = pool.section()
        return {"machine": core.machine.name, **(section.to_wire() if section else {"models": [], "rotation": None})}

    @rpc.method("models.get", params=ModelParams, doc="One model with its history, load phases and log tail.")
    async def models_get(peer: Peer, params: ModelParams) -> dict[str, Any]:
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
        return {
            **pool.info(slot).to_wire(),
            "path": str(slot.path),
            "history": [{**r, "detail": json.loads(r["detail"]) if r["detail"] else None} for r in history],
            "swaps": swaps,
            "load_phases": engine.load_phases() if engine else {},
            "log_tail": engine.log_tail(40) if engine else [],
            "log_path": str(engine.log_path) if engine else None,
        }

    @rpc.method("models.warm", role=Role.OPERATOR, params=ModelParams, doc="Bring a model up (or wake it); returns at once.")
    async def models_warm(peer: Peer, params: ModelParams) -> dict[str, Any]:
        slot = pool.slot(params.model)
        pool.warm(slot)
        slot.operator_warm = True
        return pool.info(slot).to_wire()

    @rpc.method(
        "models.sleep", role=Role.OPERATOR, params=ModelParams, doc="Put a warm model to sleep (GPU freed, weights in RAM)."
    )
    async def models_sleep(peer: Peer, params: ModelParams) -> dict[str, Any]:
        slot = pool.slot(params.model)
        pool.sleep(slot)
        slot.operator_warm = False
        return pool.info(slot).to_wire()

    @rpc.method("models.cold", role=Role.OPERATOR, params=ModelParams, doc="Stop a model's engine; waits until it is stopped.")
    async def models_cold(peer: Peer, params: ModelParams) -> dict[str, Any]:
        slot = pool.slot(params.model)
        slot.operator_warm = False
        await pool.cold(slot)
        return pool.info(slot).to_wire()

    @rpc.method(
        "models.swap", role=Role.OPERATOR, params=SwapParams, doc="Free OUT's GPUs and bring IN up there; returns at once."
    )
    async def models_swap(peer: Peer, params: SwapParams) -> dict[str, Any]:
        out, incoming = pool.slot(params.out), pool.slot(params.in_)
        pool.swap(out, incoming)
        out.operator_warm, incoming.operator_warm = False, True
        return {"out": pool.info(out).to_wire(), "in": pool.info(incoming).to_wire()}

    @rpc.method("models.cache", role=Role.OPERATOR, params=ModelParams, doc="Pre-read a model's files into RAM (page cache).")
    async def models_cache(peer: Peer, params: ModelParams) -> dict[str, Any]:
        slot = pool.slot(params.model)
        await pool.cache(slot)
        return pool.info(slot).to_wire()

    @rpc.method("models.pin", role=Role.OPERATOR, params=PinParams, doc="Pin (or unpin) a model: rotation never takes it out.")
    async def models_pin(peer: Peer, params: PinParams) -> dict[str, Any]:
        slot = pool.slot(params.model)
        slot.pinned = params.pinned
        pool.book.kv_save(pins={s.name: s.pinned for s in pool.slots.values()})
        return pool.info(slot).to_wire()

    @rpc.method("models.rotation", doc="The rotation plan, the next rotation time and the measured overhead.")
    async def models_rotation(peer: Peer, _params: Any) -> dict[str, Any]:
        return pool.rotation_info().to_wire()

    @rpc.method("models.rotate", role=Role.OPERATOR, doc="Run the next rotation of the plan now; returns at once.")
    async def models_rotate(peer: Peer, _params: Any) -> dict[str, Any]:
        if not core.lab.orchestra.rotation:
            raise RemoteError(ErrorCode.UNAVAILABLE, "lab.yaml has no orchestra.rotation plan")
        pool.rotation.start()
        for slot in pool.slots.values():  # the operator's latest command wins: this rotation may take them out
            slot.operator_warm = False
        await asyncio.sleep(0)
        return pool.rotation_info().to_wire()

    @rpc.method(
        "models.adapter",
        role=Role.OPERATOR,
        params=AdapterParams,
        doc="Load a LoRA adapter into a warm vLLM (or sim) model; on llama.cpp, select one named at start.",
    )
    async def models_adapter(peer: Peer, params: AdapterParams) -> dict[str, Any]:
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
        return {**pool.info(slot).to_wire(), "adapter": params.name}
