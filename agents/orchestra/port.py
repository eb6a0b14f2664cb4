"""What others ask of the model pool (``core.find(ModelsPort)``), and the ``ModelView`` of one model it hands out.

The SSH server asks which local ports are engines (gateway forwards go only there); the jobs ask which models
hold GPUs; the checkpoints serve a checkpoint through it (an adapter into a warm model, or a model of its own).
Nothing else of the pool's internals (slots, engines) is another component's to touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agents.wire.lab.model import Model
from agents.wire.sections.models import ModelError, ModelInfo
from agents.wire.states import ModelState

if TYPE_CHECKING:
    from agents.orchestra.spec import EngineSpec
    from agents.runtime.torch_probe import TorchReader
    from agents.wire.sections.gpu_support import Stack, StackKind


@dataclass(frozen=True)
class ModelView:
    """One model of the pool as others see it: a copy, taken when asked."""

    name: str
    model: Model  # its lab.yaml entry (or the entry made at run time for a served checkpoint)
    path: Path  # its weights
    state: ModelState
    busy: bool  # an operation (warm, swap, sleep ...) is running on it
    spec: EngineSpec  # what its engine can do
    engine_serial: int | None  # its running engine (None: none); another number after the engine restarted
    endpoint: str | None
    error: ModelError | None


@dataclass(frozen=True)
class LoraConversion:
    """How to convert a PEFT adapter to a GGUF one (llama.cpp's convert_lora_to_gguf.py): run argv with env."""

    argv: list[str]
    env: dict[str, str]
    out: Path


@runtime_checkable
class ModelsPort(Protocol):
    def engine_ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports the engines of this machine listen on (those lab.yaml puts on a port)."""
        ...

    def engine_sockets(self) -> frozenset[str]:
        """The unix socket paths the engines of this machine listen on now."""
        ...

    def rpc_ports(self) -> frozenset[int]:
        """The 127.0.0.1 ports of the rpc-servers this machine runs now for models spread over it (lab.yaml's rpc:)."""
        ...

    def holding_gpus(self) -> list[ModelInfo]:
        """The models that occupy their GPUs now (a sleeping vLLM engine has given them back)."""
        ...

    def view(self, name: str) -> ModelView:
        """The model of that name on this machine; RemoteError NOT_FOUND (saying where it runs, if elsewhere) when it is not here."""
        ...

    def find_view(self, name: str) -> ModelView | None:
        """The model of that name on this machine, None when there is none."""
        ...

    def adapter_host(self, base: Path) -> ModelView | None:
        """A warm model whose engine loads LoRA adapters at run time and whose weights are ``base``."""
        ...

    def engine_spec(self, engine: str) -> EngineSpec:
        """What an engine of lab.yaml's ``engine:`` names can do."""
        ...

    def engine_stack_kind(self, engine: str) -> StackKind | None:
        """The kind of stack that engine launches on a GPU (None: not known, so not checked)."""
        ...

    def engine_stack(self, engine: str, reader: TorchReader) -> Stack | None:
        """What this machine's build of that engine has kernels for, read now (slow reads cached by ``reader``)."""
        ...

    def engine_stacks(self, reader: TorchReader) -> list[Stack]:
        """The GPU stacks of this machine's real engines (vLLM, llama-server ...), for the GPU support section. Blocking."""
        ...

    def adapter_problem(self, name: str, adapter_dir: Path) -> str | None:
        """Why the model's engine cannot hot-load the PEFT adapter in ``adapter_dir`` (None: it can)."""
        ...

    async def load_adapter(self, name: str, adapter: str, path: str) -> None:
        """Load a LoRA adapter into the model's running engine; RemoteError UNAVAILABLE when it refuses or is down."""
        ...

    def lora_conversion(self, adapter: Path, base: Path, out: Path) -> LoraConversion | None:
        """The command converting a PEFT adapter into the GGUF file ``out``; None where llama.cpp's converter is not here."""
        ...

    def add_model(self, model: Model, path: Path) -> ModelView:
        """A model made at run time (a checkpoint served as a model), from now on part of the pool."""
        ...

    def remove_model(self, name: str) -> None:
        """Forget a model made at run time (it must be at rest); lab.yaml's models stay."""
        ...

    async def bring_up(self, name: str) -> ModelView:
        """Warm the model and wait until it is warm or failed; a refusal is a RemoteError before anything starts."""
        ...
