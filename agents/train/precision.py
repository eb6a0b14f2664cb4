"""Which float format a run trains in, from the GPU's compute capability (not torch's bf16 emulation).

``torch.cuda.is_bf16_supported()`` says True on Volta and Pascal through emulation, so the
choice is made from the capability itself:

=============================  ==========  ==========================================
GPU (compute capability)       ``auto``    notes
=============================  ==========  ==========================================
Ampere and newer (>= 8.0)      bf16        tf32 and torch_compile work
Volta, Turing (7.x)            fp16        loss scaling; no tf32 (Ampere-only)
Pascal (6.x) and older         fp32        fp16 runs at a fraction of fp32 there;
                                           no tf32, no torch_compile (Triton needs 7.0)
no CUDA GPU (CPU)              fp32        tf32 and mixed precision do not apply
=============================  ==========  ==========================================

An explicit ``bf16`` below 8.0 is refused (it would train on slow emulated bf16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Precision = Literal["bf16", "fp16", "fp32"]
PrecisionChoice = Literal["auto", "bf16", "fp16", "fp32"]

BF16_MIN_CAPABILITY = (8, 0)  # native bfloat16 tensor cores: Ampere
TF32_MIN_CAPABILITY = (8, 0)  # TF32 tensor cores: Ampere
FP16_FAST_MIN_CAPABILITY = (7, 0)  # Volta's tensor cores; Pascal's fp16 throughput is a small fraction of fp32
TRITON_MIN_CAPABILITY = (7, 0)  # torch._inductor raises GPUTooOldForTriton below this


class PrecisionRefused(ValueError):
    """The requested precision cannot run on this GPU; str() says why and what to use."""


@dataclass(frozen=True)
class PrecisionPlan:
    """What the run uses: the float format, whether tf32 and compile are on, and why (notes)."""

    precision: Precision
    tf32: bool
    torch_compile: bool
    notes: list[str] = field(default_factory=list)


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def plan_precision(
    requested: PrecisionChoice,
    capability: tuple[int, int] | None,
    *,
    tf32: bool,
    torch_compile: bool,
    device_name: str = "this GPU",
) -> PrecisionPlan:
    """Decide the run's precision for a device of ``capability`` (None: CPU).

    Raises PrecisionRefused for an explicit bf16 below compute capability 8.0 and for fp16 on CPU.
    tf32 and torch_compile that cannot work here are turned off with a note, never an error.
    """
    notes: list[str] = []
    if capability is None:
        if requested == "fp16":
            raise PrecisionRefused(
                "precision: fp16 needs a CUDA GPU (mixed precision with loss scaling); none is visible here. "
                "Use precision: auto or fp32"
            )
        precision: Precision = "bf16" if requested == "bf16" else "fp32"
        notes.append(f"no CUDA GPU: training on the CPU in {precision}")
        if tf32:
            notes.append("tf32 only applies to CUDA GPUs; ignored on the CPU")
        return PrecisionPlan(precision, False, torch_compile, notes)

    where = f"{device_name} (compute capability {_cc(capability)})"
    if requested == "bf16" and capability < BF16_MIN_CAPABILITY:
        raise PrecisionRefused(
            f"precision: bf16 needs compute capability {_cc(BF16_MIN_CAPABILITY)} (Ampere) or newer; {where} "
            "only emulates bfloat16, slowly. Use precision: auto (fp16 on 7.x, fp32 on Pascal) or fp16/fp32"
        )
    if requested == "auto":
        if capability >= BF16_MIN_CAPABILITY:
            precision = "bf16"
        elif capability >= FP16_FAST_MIN_CAPABILITY:
            precision = "fp16"
        else:
            precision = "fp32"
        notes.append(f"precision auto: {precision} on {where}" + (" with loss scaling" if precision == "fp16" else ""))
    else:
        precision = requested
        if precision == "fp16" and capability < FP16_FAST_MIN_CAPABILITY:
            notes.append(f"precision fp16 on {where}: fp16 runs far slower than fp32 on Pascal; precision: auto picks fp32")
    use_tf32 = tf32 and capability >= TF32_MIN_CAPABILITY
    if tf32 and not use_tf32:
        notes.append(f"tf32 off: it needs compute capability {_cc(TF32_MIN_CAPABILITY)} (Ampere) or newer; {where}")
    use_compile = torch_compile and capability >= TRITON_MIN_CAPABILITY
    if torch_compile and not use_compile:
        notes.append(f"torch_compile off: Triton needs compute capability {_cc(TRITON_MIN_CAPABILITY)} or newer; {where}")
    return PrecisionPlan(precision, use_tf32, use_compile, notes)


def compute_dtype(precision: Precision) -> Any:
    """The torch dtype the matmuls run in: QLoRA's bnb_4bit_compute_dtype follows the run's precision."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]


def device_capability() -> tuple[tuple[int, int] | None, str]:
    """(compute capability, name) of the CUDA device this process trains on; (None, "CPU") without one."""
    import torch

    if not torch.cuda.is_available():
        return None, "CPU"
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return (major, minor), torch.cuda.get_device_name(index)
