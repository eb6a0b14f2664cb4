"""The suite's own set-up: the cached CPU llama-server though a CUDA build is found first, the GPU workstation stand-
in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# ---------------------------------------------------------------------------- the suite on a GPU workstation


def test_the_suite_runs_the_cached_cpu_llama_server_though_a_cuda_build_is_found_first(tmp_path, monkeypatch):
    """find_llama_server takes the cache's CUDA build first (what an operator wants); on a GPU workstation that had the
    tests' engines on a real GPU and judged the test labs' simulated GPUs against its archs. The suite pins the CPU
    build (tests/conftest.py), and keeps an operator's own CETLAB_LLAMA_SERVER."""
    from agents.orchestra.engines.llamacpp import build as llamacpp_build
    from tests.support.lab import pin_llama_server

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(llamacpp_build.BINARY_ENV, raising=False)
    for cuda in (False, True):
        binary = llamacpp_build.build_dir(cuda) / "bin" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.write_bytes(b"\x7fELF")
        (binary.parent.parent / llamacpp_build.STAMP_NAME).write_text(json.dumps({"cuda": cuda}))
    assert llamacpp_build.find_llama_server() == llamacpp_build.build_dir(True) / "bin" / "llama-server"
    environ: dict[str, str] = {}
    pin_llama_server(environ)
    monkeypatch.setenv(llamacpp_build.BINARY_ENV, environ[llamacpp_build.BINARY_ENV])
    assert llamacpp_build.find_llama_server() == llamacpp_build.build_dir(False) / "bin" / "llama-server"
    mine = {llamacpp_build.BINARY_ENV: "/opt/llama/llama-server"}
    pin_llama_server(mine)
    assert mine == {llamacpp_build.BINARY_ENV: "/opt/llama/llama-server"}


def test_the_gpu_workstation_stand_in_answers_nvml_as_a_driver_with_one_gpu():
    """CETLAB_TEST_AS_GPU_WORKSTATION's pynvml and nvidia-smi (tests/support/gpu_workstation/) give the agents' NVML sampler and
    machine add's pre-flight one GPU, in the forms the real ones answer, to this process and the processes it starts."""
    stand_ins = Path(__file__).resolve().parents[2] / "support" / "gpu_workstation"
    probe = (
        "from agents.telemetry.nvml import NvmlSampler\n"
        "s = NvmlSampler(); (g,) = s.sample(); s.close()\n"
        "print(s.status, g.name, g.compute_capability, g.mem_total_bytes, g.failed)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stand_ins), str(Path(__file__).resolve().parents[3])])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["None", "NVIDIA", "GeForce", "RTX", "3050", "8.6", str(8 * 2**30), "None"], done.stderr
    smi = subprocess.run(
        [str(stand_ins / "nvidia-smi"), "--query-gpu=index,name,compute_cap,memory.total,driver_version",
         "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert smi.stdout.strip() == "0, NVIDIA GeForce RTX 3050, 8.6, 8192, 550.54.15"
