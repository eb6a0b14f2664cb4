"""What an engine is, as data: how it frees and wakes, what it loads, what it needs from a GPU.

Each engine module declares one ``EngineSpec`` on its Engine class; everything outside the engine
(the pool, the gateway, checkpoint serving, the doctor) asks the spec, never the engine's name.
The registry of engines is agents.orchestra.engines (one module per engine beside it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from agents.wire.sections.gpu_support import StackKind

# How an engine hands its GPUs back without the pool forgetting the model:
#   "sleep": the process stays and answers /health; weights (level 2) or KV cache (1) leave the GPU; wake() brings them back
#   "stop":  the process ends; the weights stay in the page cache (state cached), so the next load reads them at RAM speed
FreeMode = Literal["sleep", "stop"]

# How an engine takes a LoRA adapter:
#   "runtime": any PEFT adapter folder at run time (vLLM's /v1/load_lora_adapter), within the engine's rules
#   "at-start": GGUF adapters named when the server starts (--lora), switched on and off at run time (llama.cpp /lora-adapters)
#   "none": no adapters; a checkpoint is merged into its base and served as a model
AdapterMode = Literal["runtime", "at-start", "none"]

# How one model spreads over several GPUs of a machine
MultiGpu = Literal["tensor-parallel", "layer-split", "command", "none"]  # command: what its command line does with {gpus}

# Model formats: a Hugging Face folder (config.json + safetensors) or one GGUF file
ModelFormat = Literal["hf", "gguf"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine's declared contract; the fields are read by the pool, gateway, checkpoints and doctor."""

    name: str  # lab.yaml's `engine:` value
    title: str  # for people: "vLLM", "llama.cpp (llama-server)"
    simulated: bool = False  # figures from it are SIM
    free_mode: FreeMode = "stop"
    sleep_levels: tuple[int, ...] = ()  # the levels `sleep_level` may take (free_mode "sleep")
    adapters: AdapterMode = "none"
    adapter_format: Literal["peft", "gguf", "none"] = "none"
    multi_gpu: MultiGpu = "none"
    model_formats: tuple[ModelFormat, ...] = ("hf",)
    # what lab.yaml's model.serves may say for it: the routes it is started to answer (chat, embedding, rerank)
    serves: tuple[str, ...] = ("chat",)
    # /metrics: the engine's series for each figure the console shows (None: the engine has no such series)
    metric_names: dict[str, str | None] = field(default_factory=dict)
    # the lowest CUDA compute capability any build of this engine runs on (None: no CUDA floor, e.g. a CPU build);
    # the engine class's gpu_build() says what this machine's build has
    min_compute_capability: float | None = None
    # the kernels it launches on a GPU, which the GPU support check reads: a Python's torch, vLLM (its floor and its
    # torch), a llama-server build, none (SIM: a simulated engine is a CPU process), or not known (None: not checked)
    gpu_stack: StackKind | None = None
    # load-phase lines in the engine's log: phase name -> regex whose first group is seconds
    load_phases: dict[str, str] = field(default_factory=dict)
    # chat parameters the engine refuses outright, which the gateway refuses first, naming the param
    refuses_params: tuple[str, ...] = ()
    # a flag among a model's args that takes tools away (llama-server's --no-jinja: no chat template renders them)
    tools_off_flag: str | None = None
    # the engine's own name for a request's length, sent beside max_tokens (llama-server's n_predict: it reads no
    # max_completion_tokens, and without a length writes to the end of its context)
    length_param: str | None = None
    # the flag a model's args need for tool_choice "auto" (vLLM reads calls out of free text only with a parser)
    auto_tools_flag: str | None = None

    @property
    def can_sleep(self) -> bool:
        return self.free_mode == "sleep"

    @property
    def hot_adapters(self) -> bool:
        """True when a trained adapter folder can be loaded into a warm model without a restart."""
        return self.adapters == "runtime"

    @property
    def has_metrics(self) -> bool:
        return any(self.metric_names.values())

    def parse_phases(self, text: str) -> dict[str, float]:
        """The load phases found in an engine log (the last of each), in seconds."""
        phases: dict[str, float] = {}
        for key, pattern in self.load_phases.items():
            found = re.findall(pattern, text)
            if found:
                seconds = float(found[-1])
                if math.isfinite(seconds):
                    phases[key] = seconds
        return phases

    def accepts(self, path: str) -> ModelFormat | None:
        """The format of the model at ``path`` when this engine loads it; None when it cannot."""
        fmt: ModelFormat = "gguf" if path.lower().endswith(".gguf") else "hf"
        return fmt if fmt in self.model_formats else None


@dataclass(frozen=True)
class GpuBuild:
    """What this machine's build of an engine can run on: CPU only, CUDA with these archs, or not known."""

    kind: Literal["cuda", "cpu", "unknown", "absent"]
    archs: tuple[str, ...] = ()  # CUDA archs with kernels, e.g. ("61", "70") (sm_61, sm_70); empty: not known
    min_compute_capability: float | None = None  # the engine's own floor (vLLM: 7.0)
    detail: str = ""  # where the answer came from (a build stamp, `--version`, ...)

    def runs_on(self, compute_capability: float) -> bool | None:
        """Whether this build has kernels for a GPU of this compute capability (None: cannot tell)."""
        if self.kind == "absent":
            return False
        if self.kind == "cpu":
            return False  # a CPU build runs, but not on the GPU
        if self.min_compute_capability is not None and compute_capability < self.min_compute_capability:
            return False
        if not self.archs:
            return None
        major, minor = int(compute_capability), round(compute_capability * 10) % 10
        wanted = major * 10 + minor
        # a binary runs on its arch and on later minors of the same major (sm_61 kernels on 6.2); PTX is not counted
        return any(int(a) // 10 == major and int(a) <= wanted for a in self.archs if a.isdigit())
