"""The vLLM engine: `vllm serve` with sleep mode, Prometheus metrics and runtime LoRA loading."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from agents.orchestra.engine import VLLM_METRICS, VLLM_PHASES, Engine, VllmSleepMixin
from agents.orchestra.spec import EngineSpec
from agents.wire.protocol import ErrorCode, RemoteError


def vllm_cli() -> str | None:
    """`vllm` beside the agent's Python first: systemd's PATH does not hold the venv."""
    beside = Path(sys.executable).with_name("vllm")
    return str(beside) if beside.exists() else shutil.which("vllm")


VLLM_SPEC = EngineSpec(
    gpu_stack="vllm",
    name="vllm",
    title="vLLM",
    free_mode="sleep",
    sleep_levels=(1, 2),
    adapters="runtime",
    adapter_format="peft",
    multi_gpu="tensor-parallel",
    model_formats=("hf",),
    metric_names=VLLM_METRICS,
    min_compute_capability=7.0,  # vLLM's floor in every build (no Pascal)
    load_phases=VLLM_PHASES,
)


class VllmEngine(VllmSleepMixin, Engine):
    spec = VLLM_SPEC

    def check(self) -> None:
        if vllm_cli() is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"vllm is not installed on {self.machine} (pip install vllm there, or use engine: sim)"
            )

    def argv(self) -> list[str]:
        return [vllm_cli() or "vllm", "serve", str(self.path), *self.serve_flags()]
