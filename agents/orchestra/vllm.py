"""The vLLM engine: `vllm serve` with sleep mode, Prometheus metrics and runtime LoRA loading."""

from __future__ import annotations

import math
import shutil

from agents.orchestra.engine import GIB, Engine, VllmSleepMixin
from agents.protocol import ErrorCode, RemoteError

MAX_GPU_MEMORY_UTILIZATION = 0.95


class VllmEngine(VllmSleepMixin, Engine):
    kind = "vllm"
    has_metrics = True

    def check(self) -> None:
        if shutil.which("vllm") is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"vllm is not installed on {self.machine} (pip install vllm there, or use engine: sim)")

    def argv(self) -> list[str]:
        args = list(self.model.args)
        argv = ["vllm", "serve", str(self.path), "--host", self.host, "--port", str(self.port),
                "--served-model-name", self.served_name, "--enable-sleep-mode"]
        if "--tensor-parallel-size" not in args and len(self.gpus) > 1:
            argv += ["--tensor-parallel-size", str(len(self.gpus))]
        if "--gpu-memory-utilization" not in args and self.gpu_total_bytes and self.model.vram_gib:
            # vLLM takes a share of each GPU: the model's estimate, not the default 90%
            per_gpu = self.model.vram_gib * GIB / max(1, len(self.gpus))
            share = min(MAX_GPU_MEMORY_UTILIZATION, math.ceil(100 * per_gpu / self.gpu_total_bytes) / 100)
            argv += ["--gpu-memory-utilization", f"{share:.2f}"]
        return argv + args

    def env(self) -> dict[str, str]:
        env = super().env()
        env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes /sleep, /wake_up, /is_sleeping
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # exposes /v1/load_lora_adapter
        return env
