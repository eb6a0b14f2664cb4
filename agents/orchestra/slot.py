"""One model of the pool and everything known about it: its state, engine, operation and figures."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.documents import EngineFigures
from agents.lab import Model
from agents.orchestra.engine import GIB, Engine
from agents.states import MODEL_ENGINE_UP, MODEL_HOLDS_GPU, ModelState

ADAPTER_ENGINES = ("vllm", "sim")  # engines that load LoRA adapters at run time (/v1/load_lora_adapter)
SLEEP_RESIDUAL_BYTES = GIB // 2  # CUDA context and buffers a sleeping vLLM keeps on each GPU


class EngineFailed(Exception):
    """The engine died or never became healthy; the message says what to look at."""


@dataclass(eq=False)
class Slot:
    """One model of this machine and everything known about it."""

    model: Model
    path: Path
    gpus: list[int]
    state: ModelState = ModelState.COLD
    since: float = field(default_factory=time.time)
    engine: Engine | None = None
    last_engine: Engine | None = None  # for logs after a stop or a failure
    op: asyncio.Task | None = None
    op_name: str | None = None
    progress: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    pinned: bool = False
    operator_warm: bool = False  # an operator asked for it warm: the start plan and the timed rotation leave it up
    cached_bytes: int = 0
    size_bytes: int = 0
    last_used: float = 0.0
    metrics: EngineFigures = field(default_factory=EngineFigures)  # the engine's last /metrics (warm models)
    tokens_per_s: float | None = None  # generation rate between the last two polls
    timings: dict[str, float] = field(default_factory=dict)  # last load_s, warmup_s, wake_s, swap_s, cache_s
    token_mark: tuple[float, float] | None = None  # (monotonic time, generation tokens) of the last poll
    measured: dict[int, int] | None = None  # NVML's bytes per GPU for the engine's processes, this state (None: estimate)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def busy(self) -> bool:
        return self.op is not None and not self.op.done()

    @property
    def cached_fraction(self) -> float | None:
        return None if not self.size_bytes else round(self.cached_bytes / self.size_bytes, 3)

    def held_bytes(self, index: int | None = None) -> int:
        """What this model holds on GPU ``index`` (None: its largest share) now: NVML's figure when measured, else its estimate."""
        if not self.gpus:
            return 0
        if self.measured is not None and self.state in MODEL_ENGINE_UP:
            return self.measured.get(index, 0) if index is not None else max(self.measured.values(), default=0)
        if self.state in MODEL_HOLDS_GPU:
            return int(self.model.vram_gib * GIB / len(self.gpus))
        return SLEEP_RESIDUAL_BYTES if self.state == ModelState.SLEEPING else 0


    def vram_bytes(self) -> int:
        """The model's VRAM over all its GPUs: measured when NVML tells, else the lab.yaml estimate."""
        return sum(self.measured.values()) if self.measured is not None else int(self.model.vram_gib * GIB)


def gib_text(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
