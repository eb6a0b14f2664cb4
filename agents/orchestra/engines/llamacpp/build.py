"""Build the pinned llama-server once, cached outside the checkout; find it again.

The llama.cpp source is the one vendored in llama-cpp-python's source distribution on PyPI
(vendor/llama.cpp), downloaded with pip, so the version is pinned by one number (PIN).
A CPU build is the default; ``--cuda`` builds with CUDA for the archs given (``--cuda-archs "61;70;86"``).

    python -m agents.orchestra.engines.llamacpp.build             # CPU build (make llama-server)
    python -m agents.orchestra.engines.llamacpp.build --cuda --cuda-archs "61;70"
    python -m agents.orchestra.engines.llamacpp.build --print-path

The build lands in ${XDG_CACHE_HOME:-~/.cache}/cetlab/llama-server-<PIN>[-cuda]/ with bin/llama-server,
ggml-vocab-llama-spm.gguf (the tokenizer the tests' tiny GGUF uses), convert_lora_to_gguf.py and
convert_hf_to_gguf.py with what they import (gguf-py, conversion/), and build.json (the stamp: pin, llama.cpp commit, CPU or CUDA and its archs, cmake flags).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PIN = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is the llama.cpp cetlab tests and serves with
BINARY_ENV = "CETLAB_LLAMA_SERVER"  # a llama-server of one's own (a distribution's or a CUDA build elsewhere)
RPC_BINARY_ENV = "CETLAB_RPC_SERVER"  # an rpc-server of one's own (same build as the model machine's llama-server)
VOCAB_NAME = "ggml-vocab-llama-spm.gguf"
STAMP_NAME = "build.json"
RPC_TARGET = "ggml-rpc-server"  # llama.cpp's tools/rpc target (built with GGML_RPC); cached as bin/rpc-server
MAKE_HINT = "make llama-server (or: python -m agents.orchestra.engines.llamacpp.build)"
# a cached build is complete with all of these (an older layout is built again)
COMPLETE = ("bin/llama-server", "bin/rpc-server", STAMP_NAME, VOCAB_NAME, "convert_lora_to_gguf.py", "gguf-py", "conversion")
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_RPC=ON",  # rpc-server: a helper machine lends its GPUs to a model spread over several machines
]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cetlab"


def build_dir(cuda: bool = False) -> Path:
    return cache_root() / f"llama-server-{PIN}{'-cuda' if cuda else ''}"


def read_stamp(binary: Path) -> dict[str, Any] | None:
    """The build stamp beside a cached build's bin/ (None for a binary cetlab did not build)."""
    try:
        doc = json.loads((binary.parent.parent / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def find_llama_server() -> Path | None:
    """$CETLAB_LLAMA_SERVER, then the cached CUDA build, the cached CPU build, then llama-server on PATH."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    for cuda in (True, False):
        binary = build_dir(cuda) / "bin" / "llama-server"
        if binary.is_file() and (binary.parent.parent / STAMP_NAME).is_file():
            return binary
    found = shutil.which("llama-server")
    return Path(found) if found else None


def find_rpc_server() -> Path | None:
    """llama.cpp's rpc-server: $CETLAB_RPC_SERVER, else beside the llama-server found (a cached build has both), else on
    PATH (as rpc-server, or ggml-rpc-server as llama.cpp's own build names it)."""
    named = os.environ.get(RPC_BINARY_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    server = find_llama_server()
    if server is not None:
        for name in ("rpc-server", RPC_TARGET):
            if (server.parent / name).is_file():
                return server.parent / name
    for name in ("rpc-server", RPC_TARGET):
        if found := shutil.which(name):
            return Path(found)
    return None


def vocab_file() -> Path | None:
    for cuda in (False, True):
        path = build_dir(cuda) / VOCAB_NAME
        if path.is_file():
            return path
    return None


STEP = re.compile(rb"^\[(\d+)/(\d+)\] ")  # ninja's status line: "[412/1035] Building CXX object ..."
PROGRESS_EVERY_PCT = 5  # without a terminal (make's output in a CI log), a progress line every this share of the steps


class Progress:
    """The build's step count from ninja's [N/M] lines: on a terminal one line rewritten in place, else a line every
    PROGRESS_EVERY_PCT percent (an 8-minute build said nothing between its first lines and its end)."""

    def __init__(self, what: str, tty: bool) -> None:
        self.what, self.tty = what, tty
        self.said_pct = -PROGRESS_EVERY_PCT
        self.started = time.monotonic()

    def line(self, raw: bytes) -> str | None:
        """What to print for one line of the build's output (None: nothing)."""
        match = STEP.match(raw)
        if match is None:
            return None
        step, total = int(match[1]), int(match[2])
        pct = 100 * step // max(1, total)
        if not self.tty and pct < self.said_pct + PROGRESS_EVERY_PCT and step != total:
            return None
        self.said_pct = pct
        return f"{self.what}: step {step}/{total} ({pct}%, {time.monotonic() - self.started:.0f} s)"


def _run(argv: list[str], cwd: Path | None = None, log: Path | None = None, progress: str | None = None) -> None:
    print("+", " ".join(argv), flush=True)
    if log is None:
        subprocess.run(argv, cwd=cwd, check=True)
        return
    tty = sys.stdout.isatty()
    counter = Progress(progress, tty) if progress else None
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None  # stdout=PIPE
        for raw in process.stdout:  # every line to the log; the step count to the terminal
            out.write(raw)
            said = counter.line(raw) if counter else None
            if said:
                print(f"\r{said}" if tty else said, end="" if tty else "\n", flush=True)
        done = process.wait()
    if tty and counter is not None and counter.said_pct >= 0:
        print(flush=True)
    if done != 0:
        tail = log.read_bytes()[-3000:].decode(errors="replace")
        raise SystemExit(f"{' '.join(argv[:3])} failed (exit {done}); the end of {log}:\n{tail}")


def build_command(capabilities: Iterable[float] = ()) -> str:
    """The command that builds llama-server on this machine, with its own Python (a checkout's `make llama-server`
    runs the same; a machine installed from a wheelhouse has no Makefile): CUDA for these compute capabilities, else
    a CPU build."""
    archs = sorted({str(round(cc * 10)) for cc in capabilities})  # 6.1 -> "61"
    command = f"{shlex.quote(sys.executable)} -m agents.orchestra.engines.llamacpp.build"
    return command + (f' --cuda --cuda-archs "{";".join(archs)}"' if archs else "")


def build(cuda: bool = False, cuda_archs: str | None = None, jobs: int | None = None) -> Path:
    """Download the pinned sdist with pip, build llama-server, cache it; returns the binary (built once).

    Over 80 lines: a build script's steps in the order they run (fetch, configure, compile, cache)."""
    out = build_dir(cuda)
    binary = out / "bin" / "llama-server"
    if all((out / part).exists() for part in COMPLETE):
        return binary
    for tool in ("cmake", "ninja", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama-server needs {tool} (apt-get install cmake ninja-build g++)")
    if cuda and shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        raise SystemExit("a CUDA build needs nvcc (the CUDA toolkit); leave out --cuda for a CPU build")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="llama-build-", dir=out))
    log = out / "build.log"
    started = time.monotonic()
    try:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(work),
                f"llama-cpp-python=={PIN}",
            ]
        )
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        import tarfile  # only when a build runs, not in every agent

        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        flags = list(CMAKE_FLAGS)
        if cuda:
            flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs or '61;70;75;80;86'}"]
        print(
            f"building llama-server from llama.cpp as vendored in llama-cpp-python {PIN} ({'CUDA ' + (cuda_archs or '61;70;75;80;86') if cuda else 'CPU'};"
            f" about 8 minutes on 2 cores); the build's whole output goes to {log}",
            flush=True,
        )
        _run(["cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja", *flags], log=log)
        _run(
            [
                "cmake",
                "--build",
                str(src / "build"),
                "--target",
                "llama-server",
                RPC_TARGET,
                "-j",
                str(jobs or os.cpu_count() or 2),
            ],
            log=log,
            progress="building llama-server",
        )
        (out / "bin").mkdir(exist_ok=True)
        shutil.copy2(src / "build" / "bin" / "llama-server", out / "bin" / "llama-server.part")
        os.replace(out / "bin" / "llama-server.part", binary)
        shutil.copy2(src / "build" / "bin" / RPC_TARGET, out / "bin" / "rpc-server.part")
        os.replace(out / "bin" / "rpc-server.part", out / "bin" / "rpc-server")
        shutil.copy2(src / "models" / VOCAB_NAME, out / VOCAB_NAME)
        shutil.copy2(src / "convert_lora_to_gguf.py", out / "convert_lora_to_gguf.py")
        shutil.copy2(src / "convert_hf_to_gguf.py", out / "convert_hf_to_gguf.py")
        for tree in ("gguf-py", "conversion"):  # what the converters import
            shutil.rmtree(out / tree, ignore_errors=True)
            shutil.copytree(src / tree, out / tree)
        commit = ""
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        for line in (version.stdout + version.stderr).splitlines():
            if "commit" in line:
                commit = line.strip()
        stamp = {
            "pin": f"llama-cpp-python=={PIN}",
            "llama_cpp": commit,
            "cuda": cuda,
            "cuda_archs": (cuda_archs or "61;70;75;80;86").split(";") if cuda else [],
            "cmake_flags": flags,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_s": round(time.monotonic() - started, 1),
        }
        (out / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents.orchestra.engines.llamacpp.build", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cuda", action="store_true", help="build with CUDA (needs nvcc)")
    parser.add_argument("--cuda-archs", help='CMAKE_CUDA_ARCHITECTURES, e.g. "61;70;86" (P40/P4/P1000, V100, RTX 30)')
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--print-path", action="store_true", help="print the llama-server cetlab would use, build nothing")
    args = parser.parse_args(argv)
    if args.print_path:
        found = find_llama_server()
        print(found if found else f"no llama-server: {MAKE_HINT}")
        return 0 if found else 1
    print(build(cuda=args.cuda, cuda_archs=args.cuda_archs, jobs=args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
