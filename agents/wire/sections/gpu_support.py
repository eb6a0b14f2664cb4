"""The typed facts of GPU support: a stack (what the agent would launch, with the kernels its build has) and a verdict per GPU."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from agents.wire.protocol import ComputeCapability

# sm_61 (a cubin for 6.x GPUs from 6.1 up) or compute_61 (PTX, JIT-compiled for 6.1 and every newer GPU); torch may add a/f suffixes (sm_90a)
Arch = Annotated[str, Field(pattern=r"^(sm|compute)_\d{2,3}[af]?$")]


class Section(BaseModel):
    """As agents.wire.sections.base.Section (which lists GpuSupportSection, so this module cannot import it): extra keys ignored."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class StackKind(StrEnum):
    TORCH = "torch"  # a Python's torch: trainers, and the transformers engine
    VLLM = "vllm"  # vLLM: its minimum compute capability and its own torch's kernels
    LLAMACPP = "llamacpp"  # llama.cpp's llama-server: a CPU or a CUDA build
    SIM = "sim"  # the simulated engine: a CPU process that needs no GPU


class Stack(Section):
    """What the agent would launch on a GPU, as far as its kernels go.

    ``archs`` empty with ``cpu_build`` false and no ``problem`` means the build did not say (no check is possible)."""

    name: str  # as the operator reads it: "trainer torch", "vLLM", "llama-server"
    kind: StackKind
    version: str | None = None  # "2.13.0+cu130", "0.33.0", "b6000"
    cuda: str | None = None  # the CUDA version it was built with; None for a CPU build
    archs: list[Arch] = Field(
        default_factory=list
    )  # what torch.cuda.get_arch_list() says, or the build's CMAKE_CUDA_ARCHITECTURES
    cpu_build: bool = False  # no CUDA kernels at all
    min_capability: ComputeCapability | None = None  # vLLM: 7.0 whatever its build has
    needs_gpu: bool = True  # False: the sim engine
    source: str  # where this was read: "/venv/bin/python: torch.cuda.get_arch_list()", "lab.yaml sim stacks"
    simulated: bool = False  # declared by a simulated machine's lab.yaml entry, not read from an install
    problem: str | None = None  # could not be read (not installed, timed out): no verdict

    @property
    def short_version(self) -> str:
        """ "2.13.0+cu130" -> "2.13"."""
        if self.version is None:
            return ""
        match = re.match(r"^(\d+\.\d+)", self.version)
        return match[1] if match else self.version


class Verdict(Section):
    """One GPU x one stack: does it run there, why not, and what to do."""

    machine: str
    gpu: int
    gpu_name: str
    capability: ComputeCapability | None = None
    stack: str  # Stack.name
    kind: StackKind
    runs: bool | None  # None: not known (the stack could not be read, or the GPU's capability is N/A)
    reason: str  # one sentence, whatever the answer
    fix: str | None = None  # when it does not run
    simulated: bool = False  # the GPU or the stack is simulated

    @property
    def message(self) -> str:
        """The line a refusal and doctor print: reason; fix."""
        return self.reason + (f"; {self.fix}" if self.fix else "")


class GpuSupportSection(Section):
    """The `gpu_support` section: the stacks this machine would launch, and the verdict for each GPU x stack."""

    stacks: list[Stack] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)
    simulated: bool = False

    def for_gpu(self, index: int) -> list[Verdict]:
        return [v for v in self.verdicts if v.gpu == index]
