"""A Python's torch build, read in a subprocess of that Python (cached): the trainers' stack and the one vLLM and
`transformers serve` launch on a GPU. The GPU support check and the engines that run on torch both read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from agents.wire.sections.gpu_support import Stack, StackKind

PROBE_TIMEOUT_S = (
    60.0  # importing torch on a loaded machine takes seconds; CUDA init is not needed (get_arch_list reads the build)
)
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
            archs=cuda_archs(found.archs),
            cpu_build=found.cuda is None,
            source=source,
        )


def cuda_archs(archs: list[str]) -> list[str]:
    return [a for a in archs if a.split("_")[0] in ("sm", "compute")]
