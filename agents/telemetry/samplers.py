"""Choosing a machine's GPU sampler (NVML, simulated, or none) and the interface every sampler has."""

from __future__ import annotations

from typing import Protocol

from agents.wire.lab.machines import Machine, SimGpus
from agents.wire.protocol import GpuBackend, GpuSample


class GpuSampler(Protocol):
    backend: GpuBackend
    simulated: bool
    status: str | None

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


class _NoGpus:
    backend: GpuBackend = "none"
    simulated = False

    def __init__(self, status: str):
        self.status: str | None = status

    def sample(self) -> list[GpuSample]:
        return []

    def close(self) -> None:
        pass


def open_gpu_sampler(machine: Machine) -> GpuSampler:
    if isinstance(machine.gpus, SimGpus):
        from agents.telemetry.sim import SimSampler

        return SimSampler(machine.gpus.sim, seed=machine.gpus.seed)
    if machine.gpus == "none":
        return _NoGpus("no GPUs (lab.yaml says gpus: none)")
    from agents.telemetry.nvml import NvmlSampler

    return NvmlSampler()
