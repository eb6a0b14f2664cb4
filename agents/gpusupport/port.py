"""What the orchestra and the jobs ask of the GPU support check: refuse a launch whose stack has no kernels for its GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agents.wire.lab.model import Model


@runtime_checkable
class GpuSupportPort(Protocol):
    def check_job(self, recipe: str, gpus: list[int], program: str) -> None:
        """Raise RemoteError(UNAVAILABLE) with the fix when the trainer's torch cannot run on one of these GPUs."""
        ...

    def check_model(self, model: Model, gpus: list[int]) -> None:
        """Raise RemoteError(UNAVAILABLE) with the fix when the model's engine build cannot run on one of these GPUs."""
        ...
