"""lab.yaml's lab queue: which machine's agent keeps it (`scheduler:`), and what a recipe may ask of it (`need:`,
`priority:`) instead of fixed GPU numbers (agents/scheduler/)."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from agents.wire.capability import capability_by_name, parse_capability
from agents.wire.protocol import GpuSample
from agents.wire.schema import Name, NonNegative, Strict

if TYPE_CHECKING:
    from agents.wire.lab.machines import Machine
    from agents.wire.lab.model import Lab, Trainer

GIB = 1024**3
VRAM_SLACK = 0.97  # a "24 GiB" card reports a little less than 24 GiB total (the driver's reserve): still 24 GiB
MAX_PRIORITY = 1000
MAX_GPUS_PER_JOB = 64


class Scheduler(Strict):
    """The lab queue's keeper: one machine's agent holds the queue in its SQLite and decides where each job runs."""

    machine: Name | None = None  # default: the gateway's machine, else the first machine
    interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0  # how often it looks at the queue (and after each change)
    # a job waiting this long gains one priority point (no job waits forever behind newer, higher ones)
    age_bonus_s: Annotated[float, Field(gt=0)] = 600.0


class Need(Strict):
    """What a recipe asks for instead of GPU numbers: the queue picks the machine and the GPUs."""

    gpus: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_JOB)] = 1
    min_vram_gib: NonNegative | None = None  # each GPU's memory, as NVML (or the sim spec) says
    min_compute_capability: Annotated[str, Field(pattern=r"^\d{1,2}\.\d$")] | None = None  # "7.0": Volta and newer
    gpu_name: str | None = None  # a pattern of the GPU's name (fnmatch, case-insensitive): "*P40*", "Tesla V100*"
    machines: list[Name] = Field(default_factory=list)  # where it may run; empty: any machine of the lab

    def describe(self) -> str:
        """The need in words: "1 GPU >= 24 GiB", "2 GPUs of compute capability >= 7.0 named *V100*"."""
        words = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        if self.min_vram_gib is not None:
            words += f" >= {self.min_vram_gib:g} GiB"
        if self.min_compute_capability is not None:
            words += f" of compute capability >= {self.min_compute_capability}"
        if self.gpu_name:
            words += f" named {self.gpu_name}"
        if self.machines:
            words += f" on {', '.join(self.machines)}"
        return words


def gpu_misfit(need: Need, gpu: GpuSample) -> str | None:
    """Why this GPU does not do for the need (None: it does), in words; one rule for the queue and the worker."""
    if gpu.failed:
        return f"GPU {gpu.index} has failed ({gpu.failed})"
    if need.min_vram_gib is not None:
        total = gpu.mem_total_bytes
        if total is None or total < need.min_vram_gib * GIB * VRAM_SLACK:
            memory = f"{total / GIB:.0f} GiB" if total is not None else "an unknown amount of memory"
            return f"GPU {gpu.index} ({gpu.name}) has {memory}, under {need.min_vram_gib:g} GiB"
    if need.min_compute_capability is not None:
        wanted = parse_capability(need.min_compute_capability)
        have = gpu.compute_capability or capability_by_name(gpu.name)
        if have is None or have.number < wanted.number:
            said = f"{have.major}.{have.minor}" if have is not None else "unknown"
            return f"GPU {gpu.index} ({gpu.name}) is compute capability {said}, under {need.min_compute_capability}"
    if need.gpu_name and not fnmatch.fnmatch(gpu.name.lower(), need.gpu_name.lower()):
        return f"GPU {gpu.index} ({gpu.name}) is not {need.gpu_name}"
    return None


def scheduler_machine(lab: Lab) -> str:
    """The machine whose agent keeps the lab queue."""
    if lab.scheduler.machine:
        return lab.scheduler.machine
    if lab.gateway is not None:
        return lab.gateway.machine
    return lab.machines[0].name


def queues_jobs(lab: Lab) -> bool:
    """Whether the lab has a queue to keep: it has recipes."""
    return bool(lab.trainers)


def may_run_on(recipe: Trainer, machine: str) -> bool:
    """Whether a recipe's job may run on this machine: its own, or (a recipe by need) any its need allows."""
    if recipe.need is None:
        return recipe.machine == machine
    return not recipe.need.machines or machine in recipe.need.machines


def cross_check(lab: Lab, machines: dict[str, Machine]) -> list[tuple[tuple[str | int, ...], str]]:
    """The scheduler's machine exists; a recipe by need names machines that exist and no GPU numbers or nodes."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    if lab.scheduler.machine is not None and lab.scheduler.machine not in machines:
        problems.append(
            (("scheduler", "machine"), f"no machine named {lab.scheduler.machine!r} (machines: {', '.join(machines)})")
        )
    models, pinned = {m.name for m in lab.models}, set(lab.orchestra.pinned)
    for i, name in enumerate(lab.orchestra.yields):
        if name not in models:
            problems.append((("orchestra", "yields", i), f"no model named {name!r}"))
        elif name in pinned:
            problems.append((("orchestra", "yields", i), f"{name} is pinned: a pinned model never yields its GPUs"))
    for i, trainer in enumerate(lab.trainers):
        if trainer.need is None:
            continue
        if trainer.gpus:
            problems.append(
                (
                    ("trainers", i, "need"),
                    "a recipe asks either for GPU numbers (gpus: [...]) or by need (need: {gpus: N}), not both",
                )
            )
        if trainer.nodes:
            problems.append((("trainers", i, "need"), "a multi-node recipe names its nodes' GPUs; need: is for one machine"))
        for j, name in enumerate(trainer.need.machines):
            if name not in machines:
                problems.append((("trainers", i, "need", "machines", j), f"no machine named {name!r}"))
        if trainer.need.machines and trainer.machine not in trainer.need.machines:
            problems.append(
                (("trainers", i, "machine"), f"{trainer.machine} is not among need.machines ({', '.join(trainer.need.machines)})")
            )
    return problems
