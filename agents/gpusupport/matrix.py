"""The verdict for one GPU and one stack: runs or not, in words an operator acts on, with the fix."""

from __future__ import annotations

import re

from agents.wire.protocol import ComputeCapability, GpuSample
from agents.wire.sections.gpu_support import Stack, StackKind, Verdict

CU126_INDEX = "https://download.pytorch.org/whl/cu126"
# PyTorch's CUDA 12.6 builds are the last with sm_60/61/70 kernels; CUDA 13 builds start at sm_75
CU126_TORCH = "PyTorch 2.14 from PyTorch's CUDA 12.6 wheel index"
CUDA13_FLOOR = ComputeCapability(major=7, minor=5)
LLAMACPP_ARCHS = "61;70;86"


def arch_number(arch: str) -> tuple[str, int]:
    """ "sm_61" -> ("sm", 61); "compute_90a" -> ("compute", 90)."""
    kind, _, rest = arch.partition("_")
    return kind, int(re.sub(r"[af]$", "", rest))


def has_kernels(archs: list[str], capability: ComputeCapability) -> bool:
    """Whether a build with these archs runs on a GPU of this capability.

    A cubin (sm_XY) runs on the same major from its minor up (sm_60 on a 6.1 P40); PTX (compute_XY) is JIT-compiled for XY and newer."""
    for arch in archs:
        kind, number = arch_number(arch)
        if kind == "sm" and number // 10 == capability.major and number % 10 <= capability.minor:
            return True
        if kind == "compute" and number <= capability.number:
            return True
    return False


def describe_archs(archs: list[str], capability: ComputeCapability) -> str:
    """ "kernels for sm_75 and newer" when the GPU is below them all, "up to sm_90" when above, else the list."""
    numbers = sorted({arch_number(a)[1] for a in archs})
    if not numbers:
        return "no CUDA kernels"
    if capability.number < numbers[0]:
        return f"kernels for sm_{numbers[0]} and newer"
    if capability.number > numbers[-1]:
        return f"kernels up to sm_{numbers[-1]}"
    return "kernels for " + ", ".join(f"sm_{n}" for n in numbers)


def _gpu_words(machine: str, index: int, name: str, capability: ComputeCapability, simulated: bool) -> str:
    return f"{machine} GPU {index} is a {name} ({capability.sm}{', SIM' if simulated else ''})"


def _build_words(stack: Stack) -> str:
    if stack.kind == StackKind.VLLM:
        return f"vLLM{' ' + stack.short_version if stack.short_version else ''}'s torch" + (
            f" (CUDA {stack.cuda})" if stack.cuda else ""
        )
    what = {StackKind.TORCH: "torch", StackKind.VLLM: "vLLM", StackKind.LLAMACPP: "llama-server"}.get(stack.kind, stack.name)
    version = f" {stack.short_version}" if stack.short_version else ""
    cuda = f" (CUDA {stack.cuda})" if stack.cuda else ""
    return f"this {what}{version} build{cuda}"


def torch_fix(capability: ComputeCapability, python: str | None = None, for_model: bool = False) -> str:
    """What to install so a torch has kernels for this GPU."""
    pip = f"{python} -m pip install" if python else "pip install"
    if capability.number < 50:
        fix = f"no current PyTorch build has kernels for {capability.sm}; use a newer GPU"
    elif capability.number < CUDA13_FLOOR.number:
        fix = f"install {CU126_TORCH} ({pip} 'torch==2.14.*' --index-url {CU126_INDEX})"
    else:
        fix = f"install a PyTorch build with {capability.sm} kernels ({pip} -U torch)"
    return fix + (", or serve this model with engine llamacpp" if for_model else "")


def judge(
    machine: str,
    index: int,
    gpu_name: str,
    capability: ComputeCapability | None,
    stack: Stack,
    gpu_simulated: bool = False,
    for_model: bool = False,
) -> Verdict:
    """Does ``stack`` run on this GPU? ``for_model``: the fix may point at another engine."""
    simulated = gpu_simulated or stack.simulated

    def verdict(runs: bool | None, reason: str, fix: str | None = None) -> Verdict:
        return Verdict(
            machine=machine,
            gpu=index,
            gpu_name=gpu_name,
            capability=capability,
            stack=stack.name,
            kind=stack.kind,
            runs=runs,
            reason=reason,
            fix=fix,
            simulated=simulated,
        )

    if not stack.needs_gpu:
        return verdict(True, f"{stack.name}: a simulated engine, needs no GPU")
    if stack.problem is not None:
        return verdict(None, f"{stack.name}: {stack.problem}")
    if capability is None:
        return verdict(None, f"{machine} GPU {index} ({gpu_name}): compute capability unknown (N/A from the driver)")
    gpu = _gpu_words(machine, index, gpu_name, capability, gpu_simulated)
    python = stack.source.split(":")[0] if stack.kind == StackKind.TORCH and not stack.simulated else None
    if stack.min_capability is not None and capability.number < stack.min_capability.number:
        return verdict(
            False,
            f"{gpu}; {stack.name}{' ' + stack.short_version if stack.short_version else ''} needs compute capability "
            f"{stack.min_capability} or newer",
            "serve this model with engine llamacpp (GGUF)",
        )
    if stack.cpu_build:
        if stack.kind == StackKind.LLAMACPP:
            return verdict(
                False,
                f"{gpu}; {_build_words(stack)} is a CPU build: it would run on the CPU, not the GPU",
                f'build llama-server with CUDA 12.x: cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="{LLAMACPP_ARCHS}", '
                "or leave gpus out of the model to serve it on the CPU",
            )
        return verdict(
            False,
            f"{gpu}; {_build_words(stack)} is a CPU build: it has no CUDA kernels and would not use the GPU",
            torch_fix(capability, python, for_model and stack.kind == StackKind.TORCH)
            if stack.kind == StackKind.TORCH
            else "install vLLM with a CUDA build of torch",
        )
    if not stack.archs:
        return verdict(None, f"{gpu}; {_build_words(stack)} does not say which GPUs it has kernels for")
    if has_kernels(stack.archs, capability):
        return verdict(True, f"{gpu}; {_build_words(stack)} has {capability.sm} kernels")
    reason = f"{gpu}; {_build_words(stack)} has {describe_archs(stack.archs, capability)}"
    if stack.kind == StackKind.LLAMACPP:
        return verdict(
            False,
            reason,
            f'rebuild llama-server with CUDA 12.x and -DCMAKE_CUDA_ARCHITECTURES="{LLAMACPP_ARCHS}" '
            f"(it must include {capability.number})",
        )
    if stack.kind == StackKind.VLLM:
        return verdict(
            False,
            reason,
            "install vLLM against " + CU126_TORCH + " (its wheels pin CUDA 13), or serve this model with engine llamacpp",
        )
    return verdict(False, reason, torch_fix(capability, python, for_model))


def matrix(machine: str, gpus: list[GpuSample], stacks: list[Stack]) -> list[Verdict]:
    """Every GPU x every stack (the sim engine left out: it runs anywhere)."""
    return [
        judge(machine, gpu.index, gpu.name, gpu.compute_capability, stack, gpu_simulated=gpu.simulated)
        for gpu in gpus
        if gpu.failed is None
        for stack in stacks
        if stack.needs_gpu
    ]
