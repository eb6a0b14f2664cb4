"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: models."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agents.wire.engine_address import EngineEndpoint
from agents.wire.protocol import Finite, FiniteFloat
from agents.wire.schema import EngineName
from agents.wire.sections.base import ModelOp, ModelPhase, Section, ServingMode, ServingStep
from agents.wire.states import ModelState

# where a model's VRAM need comes from (agents/orchestra/weights/vram.py): typed in lab.yaml, read from its files, or not known
VramSource = Literal["lab.yaml", "estimated from GGUF header", "estimated from safetensors header", "unknown"]


class ModelProgress(Section):
    phase: ModelPhase
    done_bytes: int | None = None
    total_bytes: int | None = None


class ModelError(Section):
    message: str
    exit_code: int | None = None
    oom: bool = False
    log_tail: list[str] = Field(default_factory=list)
    log_path: str | None = None
    t: Finite = None


class ModelInfo(Section):
    name: str
    machine: str
    engine: EngineName
    state: ModelState
    since: FiniteFloat
    gpus: list[int] = Field(default_factory=list)
    vram_bytes: int = 0
    vram_measured: bool = False  # vram_bytes is NVML's figure for the engine's processes, not the estimate
    vram_need_bytes: int | None = None  # what it needs on its GPUs altogether, from vram_source (None: unknown)
    vram_source: VramSource = "unknown"
    vram_detail: str = ""  # how the need was made (the estimate's parts), or why it is unknown
    cached_fraction: Finite = None
    size_bytes: int = 0
    load_s: Finite = None
    warmup_s: Finite = None
    wake_s: Finite = None
    swap_s: Finite = None
    requests_running: Finite = None
    requests_waiting: Finite = None
    tokens_per_s: Finite = None  # generated tokens per second over the last tokens_per_s_window_s
    tokens_per_s_window_s: Finite = None
    kv_cache_pct: Finite = None
    ttft_s: Finite = None
    # engine counters (reset when the engine restarts); the cost ledger prices tokens served from them
    prompt_tokens_total: Finite = None
    generation_tokens_total: Finite = None
    endpoint: EngineEndpoint | None = None  # unix:PATH or http://127.0.0.1:PORT/v1 (agents/wire/engine_address.py)
    served_name: str | None = None
    adapters: list[str] = Field(default_factory=list)  # LoRA adapters loaded into its engine (the gateway routes them by name)
    pinned: bool = False
    draining: bool = False  # a replica going out: it ends the requests it has and gets no new one
    can_sleep: bool = True  # its engine has a sleep mode (`s`); False: it can only be stopped (cold)
    op: ModelOp | None = None  # the operation in flight
    progress: ModelProgress | None = None
    error: ModelError | None = None
    cloud_equivalent: str | None = None
    simulated: bool = False
    helpers: list[str] = Field(default_factory=list)  # machines whose rpc-servers hold part of it (lab.yaml's rpc:)

    @property
    def machines(self) -> list[str]:
        """Every machine it runs on: its own (llama-server), then its rpc helpers."""
        return [self.machine, *self.helpers]

    @property
    def tokens_total(self) -> float | None:
        """Tokens served by the engine so far (prompt + generation), or None when it reports neither."""
        parts = [n for n in (self.prompt_tokens_total, self.generation_tokens_total) if n is not None]
        return sum(parts) if parts else None


class RotationRun(Section):
    """The last rotation: what moved and how long it took."""

    t: FiniteFloat
    index: int
    duration_s: Finite = None
    swaps: list[tuple[str, str]] = Field(default_factory=list)  # (out, in) on shared GPUs
    out: list[str] = Field(default_factory=list)
    up: list[str] = Field(default_factory=list)
    not_warm: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class Rotation(Section):
    plan: list[list[str]] = Field(default_factory=list)
    every_s: Finite = None
    index: int | None = None  # position in the plan; null at the start set
    next_set: list[str] | None = None
    next_at: Finite = None
    running: bool = False
    pinned: list[str] = Field(default_factory=list)
    unavailable_s: Finite = None
    wall_s: Finite = None
    overhead_pct: Finite = None
    target_pct: Finite = None
    last: RotationRun | None = None

    @property
    def overhead_judged(self) -> bool:
        """Whether overhead_pct is a figure to hold against the target: measured over one rotation period at least
        (a first rotation's seconds are a large share of the first minutes, and no sign of a slow rotation)."""
        return self.overhead_pct is not None and (not self.every_s or (self.wall_s or 0.0) >= self.every_s)


class ModelsSection(Section):
    models: list[ModelInfo] = Field(default_factory=list)
    rotation: Rotation | None = None


class Serving(Section):
    """How a checkpoint is served: by which model, how, and where that stands (its model's state, or a step of its own)."""

    model: str
    mode: ServingMode
    state: ModelState | ServingStep
    error: str | None = None
