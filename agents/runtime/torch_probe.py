"""A Python's torch build, read in a subprocess of that Python (cached): the trainers' stack and the one vLLM and
`transformers serve` launch on a GPU. The GPU support check and the engines that run on torch both read it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from agents.wire.sections.gpu_support import Stack, StackKind

# Importing torch on a loaded machine takes seconds (CUDA init is not needed: get_arch_list reads the build); past this
# the stack is unknown, never refused, and the probe is read again on the next ask.
PROBE_TIMEOUT_S = 20.0
PROBE_OUTPUT_LIMIT = 64 * 1024  # the probe prints one JSON line; a Python that prints more is cut here
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
    timed_out: bool = False  # not printed by the probe: set when it ran past its timeout
    pending: bool = False  # not printed by the probe: set while it has not answered yet


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


class _Readings:
    """What every view of one reader shares: the cache, the thread reading each Python, the count of probes."""

    def __init__(self) -> None:
        self.cache: dict[str, tuple[tuple[float, ...], TorchProbe]] = {}
        self.reading: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self.probes = 0


class TorchReader:
    """A Python's torch build, read in a subprocess of that Python with a timeout, cached until something is installed there.

    Each Python is read in a thread of its own. ``blocking=False`` (what the agent's event loop uses: `peeking()`) never waits
    on it: until a Python has been read, its stack is unknown (an agent that stalls is worse than one launch unchecked).
    A probe that timed out is read again on the next ask."""

    def __init__(self, timeout_s: float = PROBE_TIMEOUT_S, blocking: bool = True, readings: _Readings | None = None):
        self.timeout_s = timeout_s
        self.blocking = blocking
        self._readings = readings or _Readings()

    @property
    def probes(self) -> int:
        """Subprocesses started (tests read it)."""
        return self._readings.probes

    def peeking(self) -> TorchReader:
        """The same reader (one cache, one thread per Python) that never blocks its caller."""
        return TorchReader(self.timeout_s, blocking=False, readings=self._readings)

    def probe(self, python: str) -> TorchProbe:
        stamp = _install_stamp(python)
        shared = self._readings
        with shared.lock:
            cached = shared.cache.get(python)
            if cached is not None and cached[0] == stamp and not cached[1].timed_out:
                return cached[1]
            thread = shared.reading.get(python)
            if thread is None:
                shared.probes += 1
                thread = threading.Thread(target=self._read, args=(python, stamp), name="torch-probe", daemon=True)
                shared.reading[python] = thread
                thread.start()
        if not self.blocking:  # what was read before (a timeout, an older install), else unknown for now
            return cached[1] if cached is not None else TorchProbe(error="still being read", pending=True)
        thread.join()
        with shared.lock:
            return shared.cache[python][1]

    def _read(self, python: str, stamp: tuple[float, ...]) -> None:
        try:
            result = self._probe(python)
        except Exception as exc:  # a probe's failure is an unknown stack, never a reader stuck "reading"
            result = TorchProbe(error=f"{type(exc).__name__}: {exc}"[:300])
        with self._readings.lock:
            self._readings.cache[python] = (stamp, result)
            self._readings.reading.pop(python, None)

    def _probe(self, python: str) -> TorchProbe:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        try:  # its own session: a timeout kills the Python and anything it started, so no pipe stays open
            proc = subprocess.Popen(
                [python, "-c", TORCH_PROBE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return TorchProbe(error=f"cannot run {python}: {exc.strerror or exc}")
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            return TorchProbe(error=f"importing torch took over {self.timeout_s:.0f} s", timed_out=True)
        stdout = out[-PROBE_OUTPUT_LIMIT:].decode(errors="replace")
        stderr = err[-PROBE_OUTPUT_LIMIT:].decode(errors="replace")
        lines = stdout.strip().splitlines()
        try:
            return (
                TorchProbe.model_validate(json.loads(lines[-1]))
                if lines
                else TorchProbe(
                    error=f"{python} exited with code {proc.returncode}: {(stderr.strip().splitlines() or [''])[-1][:200]}"
                )
            )
        except (ValueError, ValidationError):
            return TorchProbe(error=f"{python} printed no torch description: {lines[-1][:200]}")

    def stack(self, python: str, name: str = "trainer torch") -> Stack:
        """The torch of ``python`` as a stack: its CUDA archs, or a CPU build, or why it cannot be read."""
        found = self.probe(python)
        source = f"{python}: torch.cuda.get_arch_list()"
        if found.error is not None:
            unread = found.timed_out or found.pending
            problem = f"{'torch in ' + python + ' not read yet' if unread else 'no torch in ' + python} ({found.error})"
            return Stack(name=name, kind=StackKind.TORCH, source=source, problem=problem)
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
