"""The vLLM engine: `vllm serve` with sleep mode, Prometheus metrics and runtime LoRA loading."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from agents.orchestra.engine import Engine, VllmSleepMixin
from agents.protocol import ErrorCode, RemoteError


def vllm_cli() -> str | None:
    """`vllm` beside the agent's Python first: systemd's PATH does not hold the venv."""
    beside = Path(sys.executable).with_name("vllm")
    return str(beside) if beside.exists() else shutil.which("vllm")


class VllmEngine(VllmSleepMixin, Engine):
    kind = "vllm"
    has_metrics = True

    def check(self) -> None:
        if vllm_cli() is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"vllm is not installed on {self.machine} (pip install vllm there, or use engine: sim)")

    def argv(self) -> list[str]:
        return [vllm_cli() or "vllm", "serve", str(self.path), *self.serve_flags()]
