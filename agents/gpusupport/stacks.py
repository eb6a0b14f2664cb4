"""Reading the stacks the agent launches: a Python's torch (in a subprocess, cached), vLLM, llama-server, or a sim machine's declared ones."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agents.wire.capability import parse_capability
from agents.wire.lab.model import SimStack, SimStacks
from agents.wire.sections.gpu_support import Stack, StackKind

log = logging.getLogger("cetlab.gpusupport")

PROBE_TIMEOUT_S = (
    60.0  # importing torch on a loaded machine takes seconds; CUDA init is not needed (get_arch_list reads the build)
)
VLLM_MIN = "7.0"  # vLLM 0.33 needs compute capability 7.0+ whatever its torch has (FIELD_NOTES.md)
# torch.cuda.get_arch_list() reads the build's arch flags without a driver (torch 2.x: _is_compiled, not is_available)
TORCH_PROBE = """
import json, sys
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}))
    sys.exit(0)
out = {"version": torch.__version__, "cuda": torch.version.cuda, "archs": list(torch.cuda.get_arch_list())}
try:
    import vllm
    out["vllm"] = vllm.__version__
except Exception:
    pass
print(json.dumps(out))
"""

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


class TorchProbe(BaseModel):
    """What TORCH_PROBE prints: validated where it enters."""

    model_config = ConfigDict(extra="ignore")

    version: str | None = None
    cuda: str | None = None
    archs: list[str] = []
    vllm: str | None = None
    error: str | None = None


def python_of(program: str | Path) -> str | None:
    """The Python that runs a program: itself when it is a python, else its `#!` line's interpreter; None for anything else."""
    path = Path(program)
    if path.name.startswith("python"):
        return str(path)
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = words[1:]
        found = shutil.which(words[0])
        return found if found and Path(found).name.startswith("python") else None
    return words[0] if words and Path(words[0]).name.startswith("python") else None


def _install_stamp(python: str) -> tuple[float, ...]:
    """Changes when a package is installed into this Python (its site-packages folders change): the cache's key."""
    prefix = Path(python).parent.parent
    folders = [
        *prefix.glob("lib/python3*/site-packages"),
        *prefix.glob("lib/python3*/dist-packages"),
        *prefix.glob("local/lib/python3*/dist-packages"),
    ]
    stamps = []
    for folder in folders:
        try:
            stamps.append(folder.stat().st_mtime)
        except OSError:
            pass
    return tuple(stamps)


class TorchReader:
    """A Python's torch build, read in a subprocess of that Python with a timeout, cached until something is installed there."""

    def __init__(self, timeout_s: float = PROBE_TIMEOUT_S, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run):
        self.timeout_s = timeout_s
        self._run = run
        self._cache: dict[str, tuple[tuple[float, ...], TorchProbe]] = {}
        self._lock = threading.Lock()
        self.probes = 0  # subprocesses started (tests read it)

    def probe(self, python: str) -> TorchProbe:
        stamp = _install_stamp(python)
        with self._lock:
            cached = self._cache.get(python)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            self.probes += 1
            result = self._probe(python)
            self._cache[python] = (stamp, result)
            return result

    def _probe(self, python: str) -> TorchProbe:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        try:
            done = self._run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=self.timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return TorchProbe(error=f"importing torch took over {self.timeout_s:.0f} s")
        except OSError as exc:
            return TorchProbe(error=f"cannot run {python}: {exc.strerror or exc}")
        lines = done.stdout.strip().splitlines()
        try:
            return (
                TorchProbe.model_validate(json.loads(lines[-1]))
                if lines
                else TorchProbe(
                    error=f"{python} exited with code {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"
                )
            )
        except (ValueError, ValidationError):
            return TorchProbe(error=f"{python} printed no torch description: {lines[-1][:200]}")

    def stack(self, python: str, name: str = "trainer torch") -> Stack:
        """The torch of ``python`` as a stack: its CUDA archs, or a CPU build, or why it cannot be read."""
        found = self.probe(python)
        source = f"{python}: torch.cuda.get_arch_list()"
        if found.error is not None:
            return Stack(name=name, kind=StackKind.TORCH, source=source, problem=f"no torch in {python} ({found.error})")
        return Stack(
            name=name,
            kind=StackKind.TORCH,
            version=found.version,
            cuda=found.cuda,
            archs=_archs(found.archs),
            cpu_build=found.cuda is None,
            source=source,
        )


def _archs(archs: list[str]) -> list[str]:
    return [a for a in archs if a.split("_")[0] in ("sm", "compute")]


def vllm_stack(reader: TorchReader, cli: str | None) -> Stack:
    """vLLM: its minimum (7.0) and the kernels of the torch in vLLM's own Python (the `vllm` script's interpreter)."""
    minimum = parse_capability(VLLM_MIN)
    if cli is None:
        return Stack(
            name="vLLM", kind=StackKind.VLLM, min_capability=minimum, source="PATH", problem="not installed (no vllm command)"
        )
    python = python_of(cli) or sys.executable
    found = reader.probe(python)
    source = f"{python}: vllm.__version__, torch.cuda.get_arch_list()"
    if found.error is not None or found.vllm is None:
        return Stack(
            name="vLLM",
            kind=StackKind.VLLM,
            min_capability=minimum,
            source=source,
            problem=f"vLLM or its torch cannot be imported in {python}" + (f" ({found.error})" if found.error else ""),
        )
    return Stack(
        name="vLLM",
        kind=StackKind.VLLM,
        version=found.vllm,
        cuda=found.cuda,
        archs=_archs(found.archs),
        cpu_build=found.cuda is None,
        min_capability=minimum,
        source=source,
    )


def llama_server_stack() -> Stack:
    """llama-server's build as the llama.cpp engine reads it (its build stamp: CPU or CUDA with CMAKE_CUDA_ARCHITECTURES;
    a binary built elsewhere: CUDA or not, archs unknown, so no refusal)."""
    from agents.orchestra.llamacpp import LlamacppEngine

    build = LlamacppEngine.gpu_build()
    name, kind = "llama-server", StackKind.LLAMACPP
    if build.kind == "absent":
        return Stack(name=name, kind=kind, source="llama-server", problem=f"not installed: {build.detail}")
    if build.kind == "unknown":
        return Stack(name=name, kind=kind, source=build.detail, problem=f"could not be read: {build.detail}")
    return Stack(
        name=name,
        kind=kind,
        cpu_build=build.kind == "cpu",
        archs=[f"sm_{a}" for a in build.archs if a.isdigit()],
        source=build.detail,
    )


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


def sim_engine_stack() -> Stack:
    return Stack(
        name=STACK_NAMES[StackKind.SIM],
        kind=StackKind.SIM,
        needs_gpu=False,
        source="agents/orchestra/sim_server.py",
        simulated=True,
    )


def engine_stack_kind(engine: Any) -> StackKind | None:
    """The stack a model's engine launches on its GPUs (None: an engine this agent does not know, not checked).

    ``engine``: an engine class or object (its ``spec.gpu_stack``), or lab.yaml's engine name, looked up the same way."""
    from agents.orchestra.engines import ENGINES

    if isinstance(engine, str):
        engine = ENGINES.get(engine)
    spec = getattr(engine, "spec", None)
    return None if spec is None else StackKind(spec.gpu_stack)


def transformers_python() -> str:
    """The Python of `transformers serve` (the transformers engine runs the `transformers` beside the agent's Python first)."""
    beside = Path(sys.executable).with_name("transformers")
    return python_of(beside) or sys.executable if beside.exists() else sys.executable


def real_stacks(reader: TorchReader) -> dict[StackKind, Stack]:
    """This machine's installed stacks: the agent's Python's torch (what cetlab-train and transformers serve run on), vLLM, llama-server.
    Blocking (subprocesses, cached): call from a thread."""
    from agents.orchestra.vllm import vllm_cli

    return {
        StackKind.TORCH: reader.stack(sys.executable),
        StackKind.VLLM: vllm_stack(reader, vllm_cli()),
        StackKind.LLAMACPP: llama_server_stack(),
    }
