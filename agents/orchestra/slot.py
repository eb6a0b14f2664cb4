"""One model of the pool and everything known about it: its state, engine, operation and figures."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agents.orchestra.engine import GIB, Engine
from agents.orchestra.weights.vram import VramNeed, typed_need, vram_need
from agents.wire.documents import EngineFigures
from agents.wire.lab.model import Model
from agents.wire.sections.base import ModelOp
from agents.wire.sections.models import ModelError, ModelProgress
from agents.wire.states import MODEL_ENGINE_UP, MODEL_HOLDS_GPU, ModelState

SLEEP_RESIDUAL_BYTES = GIB // 2  # CUDA context and buffers a sleeping vLLM keeps on each GPU
TOKENS_PER_S_WINDOW_S = 10.0  # tokens/s is the engine's generation counter over this many seconds (a 2 s poll jumps)


@dataclass
class WindowRate:
    """A counter's rate over the last `window_s` seconds, from (time, count) samples.

    The count at the window's start is interpolated between the samples around it, so the
    rate covers exactly the window however the samples fall; until a window has passed it
    covers the samples so far. A count that goes down (the engine restarted) starts over.
    """

    window_s: float
    samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, t: float, count: float) -> float | None:
        """Record the counter at time t; the rate over the window that ends there (None until two samples)."""
        if self.samples and t <= self.samples[-1][0]:
            return self.rate()  # not later than the last sample: nothing new to say
        if self.samples and count < self.samples[-1][1]:
            self.samples.clear()
        self.samples.append((t, count))
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()  # keep one sample at or before the window's start
        return self.rate()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, c0), (t1, c1), (t, count) = self.samples[0], self.samples[1], self.samples[-1]
        start = t - self.window_s
        if t0 < start:  # the window starts between the first two samples
            c0 += (c1 - c0) * (start - t0) / (t1 - t0)
            t0 = start
        return (count - c0) / (t - t0)


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
    op: asyncio.Task[object] | None = None
    op_name: ModelOp | None = None
    progress: ModelProgress | None = None
    error: ModelError | None = None
    pinned: bool = False
    draining: bool = False  # a replica going out: the gateway sends it no new request (Lifecycle.drain)
    operator_warm: bool = False  # an operator asked for it warm: the start plan and the timed rotation leave it up
    cached_bytes: int = 0
    size_bytes: int = 0
    last_used: float = 0.0
    metrics: EngineFigures = field(default_factory=EngineFigures)  # the engine's last /metrics (warm models)
    tokens_per_s: float | None = None  # generation rate over the last TOKENS_PER_S_WINDOW_S (token_rate)
    timings: dict[str, float] = field(default_factory=dict)  # last load_s, warmup_s, wake_s, swap_s, cache_s
    token_rate: WindowRate = field(default_factory=lambda: WindowRate(TOKENS_PER_S_WINDOW_S))  # the polls' generation counts
    measured: dict[int, int] | None = None  # NVML's bytes per GPU for the engine's processes, this state (None: estimate)
    spread_share: dict[int, int] | None = None  # a model spread over other machines (rpc:): its estimate on each GPU here
    need: VramNeed = field(init=False)  # what it needs on its GPUs: lab.yaml's vram_gib, else estimated from its files

    def __post_init__(self) -> None:
        self.need = typed_need(self.model)

    def estimate_need(self) -> VramNeed:
        """Read the model's files for its need where lab.yaml gives none (blocking: call it in a thread)."""
        self.need = vram_need(self.model, self.path, max(1, len(self.gpus)))
        return self.need

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
        if self.state in MODEL_HOLDS_GPU and self.spread_share is not None:  # the rest is on its helpers' GPUs
            return self.spread_share.get(index, 0) if index is not None else max(self.spread_share.values(), default=0)
        if self.state in MODEL_HOLDS_GPU:
            return self.need.per_gpu(len(self.gpus))
        return SLEEP_RESIDUAL_BYTES if self.state == ModelState.SLEEPING else 0

    def vram_bytes(self) -> int:
        """The model's VRAM over all its GPUs: measured when NVML tells, else its need (lab.yaml's, or estimated)."""
        return sum(self.measured.values()) if self.measured is not None else self.need.bytes or 0


def gib_text(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
