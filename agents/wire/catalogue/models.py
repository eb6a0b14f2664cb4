"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: models."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from agents.wire.catalogue.method import OP, Method, NoParams, Params
from agents.wire.protocol import (
    Finite,
    FiniteFloat,
)
from agents.wire.schema import ModelName, Name
from agents.wire.sections.base import Section
from agents.wire.sections.models import ModelInfo, ModelsSection, Rotation


class ModelParams(Params):
    model: ModelName


class PinParams(ModelParams):
    pinned: bool = True


class SwapParams(Params):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    out: ModelName
    in_: ModelName = Field(alias="in")


class AdapterParams(ModelParams):
    name: Name
    path: str = Field(min_length=1, max_length=4096)


class ModelsList(ModelsSection):
    """`models.list`: the models section of one machine."""

    machine: str


class ModelEvent(Section):
    t: FiniteFloat
    event: str
    from_state: str | None = None
    to_state: str | None = None
    duration_s: Finite = None
    detail: Any = None


class SwapRecord(Section):
    t: FiniteFloat
    out_model: str | None = None
    in_model: str | None = None
    free_s: Finite = None
    bring_up_s: Finite = None
    total_s: Finite = None
    engine_s: Finite = None
    rotation: int | None = None  # 1: the swap was part of a rotation


class ModelDetail(ModelInfo):
    """`models.get`: a model with its path, history, swaps, load phases and log tail."""

    path: str
    history: list[ModelEvent] = Field(default_factory=list)
    swaps: list[SwapRecord] = Field(default_factory=list)
    load_phases: dict[str, FiniteFloat] = Field(default_factory=dict)
    log_tail: list[str] = Field(default_factory=list)
    log_path: str | None = None


class SwapResult(Section):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    out: ModelInfo
    in_: ModelInfo = Field(alias="in")


class AdapterLoaded(ModelInfo):
    adapter: str  # the adapter just loaded


MODELS_LIST = Method(
    "models.list", NoParams, ModelsList, doc="Every model of this machine with its state and figures, and the rotation plan."
)


MODELS_GET = Method("models.get", ModelParams, ModelDetail, doc="One model with its history, load phases and log tail.")


MODELS_WARM = Method("models.warm", ModelParams, ModelInfo, OP, "Bring a model up (or wake it); returns at once.")


MODELS_SLEEP = Method("models.sleep", ModelParams, ModelInfo, OP, "Put a warm model to sleep (GPU freed, weights in RAM).")


MODELS_COLD = Method("models.cold", ModelParams, ModelInfo, OP, "Stop a model's engine; waits until it is stopped.")


MODELS_SWAP = Method("models.swap", SwapParams, SwapResult, OP, "Free OUT's GPUs and bring IN up there; returns at once.")


MODELS_CACHE = Method("models.cache", ModelParams, ModelInfo, OP, "Pre-read a model's files into RAM (page cache).")


MODELS_PIN = Method("models.pin", PinParams, ModelInfo, OP, "Pin (or unpin) a model: rotation never takes it out.")


MODELS_ROTATION = Method(
    "models.rotation", NoParams, Rotation, doc="The rotation plan, the next rotation time and the measured overhead."
)


MODELS_ROTATE = Method("models.rotate", NoParams, Rotation, OP, "Run the next rotation of the plan now; returns at once.")


MODELS_ADAPTER = Method(
    "models.adapter",
    AdapterParams,
    AdapterLoaded,
    OP,
    "Load a LoRA adapter into a warm vLLM (or sim) model; on llama.cpp, select one named at start.",
)
