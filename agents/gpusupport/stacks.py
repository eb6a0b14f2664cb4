"""The stacks the GPU support check judges: this machine's installed ones (the trainers' torch, read here; each engine's,
read by the engine through the model pool's port), or a simulated machine's declared ones."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from agents.runtime.torch_probe import TorchReader
from agents.wire.capability import parse_capability
from agents.wire.lab.machines import SimStack, SimStacks
from agents.wire.sections.gpu_support import Stack, StackKind

log = logging.getLogger("cetlab.gpusupport")

VLLM_MIN = "7.0"  # vLLM 0.33 needs compute capability 7.0+ whatever its torch has (FIELD_NOTES.md)
# What a simulated machine assumes when its lab.yaml entry declares nothing: a lab installed as docs/engines.md ("Older GPUs") says.
DEFAULT_SIM_STACKS = SimStacks(
    torch=SimStack(version="2.14.0+cu126", cuda="12.6", archs=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]),
    vllm=SimStack(
        version="0.33.0",
        cuda="13.0",
        archs=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        min_compute_capability=VLLM_MIN,
    ),
    llamacpp=SimStack(version="sim", cuda="12.8", archs=["sm_61", "sm_70", "sm_86"]),
)
STACK_NAMES = {
    StackKind.TORCH: "trainer torch",
    StackKind.VLLM: "vLLM",
    StackKind.LLAMACPP: "llama-server",
    StackKind.SIM: "sim engine",
}


def sim_stacks(declared: SimStacks) -> dict[StackKind, Stack]:
    """A simulated machine's stacks: what its lab.yaml entry declares, else DEFAULT_SIM_STACKS; all labelled simulated."""
    stacks: dict[StackKind, Stack] = {}
    for kind in (StackKind.TORCH, StackKind.VLLM, StackKind.LLAMACPP):
        given: SimStack | None = getattr(declared, kind.value)
        spec: SimStack = given if given is not None else getattr(DEFAULT_SIM_STACKS, kind.value)
        minimum = spec.min_compute_capability or (VLLM_MIN if kind == StackKind.VLLM else None)
        stacks[kind] = Stack(
            name=STACK_NAMES[kind],
            kind=kind,
            version=spec.version,
            cuda=None if spec.cpu_build else spec.cuda,
            archs=list(spec.archs),
            cpu_build=spec.cpu_build,
            min_capability=parse_capability(minimum) if minimum else None,
            source="lab.yaml gpus.stacks (SIM)" if given is not None else "the sim default (SIM)",
            simulated=True,
        )
    return stacks


def real_stacks(reader: TorchReader, engine_stacks: Iterable[Stack], trainer_python: str | None = None) -> dict[StackKind, Stack]:
    """This machine's installed stacks: the trainers' torch (the Python its recipes name, else the agent's own, which
    cetlab-train runs on), then the engines' own (vLLM, llama-server: what the model pool's engines read of their builds).
    Blocking (subprocesses, cached): call from a thread."""
    stacks = {StackKind.TORCH: reader.stack(trainer_python or sys.executable)}
    for stack in engine_stacks:
        stacks.setdefault(stack.kind, stack)
    return stacks
