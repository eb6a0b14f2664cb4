"""lab.yaml's machines: where each is reached, what it costs to run, and its GPUs (NVML's, or a simulated set)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from agents.wire.schema import MAX_WATTS, Name, NonNegative, Positive, Price, Strict, Watts


class SimGpu(Strict):
    """One simulated GPU; figures follow what runs on it."""

    name: str
    memory_gib: Positive
    tdp_w: Annotated[float, Field(gt=0, le=MAX_WATTS)]
    idle_w: Watts | None = None  # default: 12% of tdp_w
    profile: Literal["idle", "training", "serving", "bursty"] = "idle"  # background load in the demo
    # "6.1"; default: from the name (Tesla P40 6.1, Tesla V100 7.0, RTX 3050 8.6, H100 9.0: agents/wire/capability.py)
    compute_capability: Annotated[str, Field(pattern=r"^\d{1,2}\.\d$")] | None = None


class SimStack(Strict):
    """A stack a simulated machine pretends to have installed (its GPUs are simulated; its processes run on the CPU)."""

    version: str | None = None  # "2.14.0+cu126"
    cuda: str | None = None  # "12.6"; leave out with cpu_build
    archs: list[Annotated[str, Field(pattern=r"^(sm|compute)_\d{2,3}[af]?$")]] = Field(default_factory=list)
    cpu_build: bool = False
    min_compute_capability: Annotated[str, Field(pattern=r"^\d{1,2}\.\d$")] | None = None


class SimStacks(Strict):
    """What a simulated machine's GPU support check judges against; each left out takes the default of a lab set up as
    docs/engines.md ("Older GPUs") says (torch 2.14 CUDA 12.6, vLLM 0.33 on CUDA 13, llama-server CUDA 12 for 61;70;86)."""

    torch: SimStack | None = None
    vllm: SimStack | None = None
    llamacpp: SimStack | None = None


class SimGpus(Strict):
    sim: list[SimGpu] = Field(min_length=0)
    seed: int = 0
    stacks: SimStacks = Field(default_factory=SimStacks)  # the stacks the GPU support check assumes here (SIM)


def _gpu_source_tag(value: Any) -> str:
    return "nvml" if value in ("nvml", "none") else "sim-spec"


GpuSource = Annotated[
    Annotated[Literal["nvml", "none"], Tag("nvml")] | Annotated[SimGpus, Tag("sim-spec")],
    Discriminator(_gpu_source_tag),
]


class Machine(Strict):
    """One lab machine; `gpus` is nvml (real), none, or {sim: [...]} (simulated)."""

    name: Name
    host: str = "127.0.0.1"
    port: int = Field(default=7022, ge=1, le=65535)
    via: Literal["agent", "sshd"] = "agent"  # sshd: ride the machine's own sshd to the agent's socket
    user: str | None = None  # ssh user for via: sshd (default: ~/.ssh/config, else the local user)
    ssh_port: int | None = Field(default=None, ge=1, le=65535)  # via: sshd: the sshd port (default: ~/.ssh/config, else 22)
    socket: str | None = None  # via: sshd: the agent's unix socket on that machine (default /var/lib/cetlab/<name>/agent.sock)
    role: str = ""  # free text: training, inference, storage ...
    idle_watts: Watts = 0.0  # host draw NVML cannot see
    hourly_rate: Price = 0.0  # > 0 for rented machines
    ram_cache_gib: NonNegative | None = None  # page-cache budget for warm-in-RAM weights
    gpus: GpuSource = "nvml"
    sample_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0

    @property
    def simulated(self) -> bool:
        return isinstance(self.gpus, SimGpus)

    @property
    def gpu_count(self) -> int | None:
        """Known only for simulated GPUs; NVML machines say at run time."""
        return len(self.gpus.sim) if isinstance(self.gpus, SimGpus) else None
