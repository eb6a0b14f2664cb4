"""The transformers pin, doctor's engine checks, and the GPU check script where there is no GPU."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.lab import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"


# ---------------------------------------------------------------------------- bench/gpu_check.sh without a GPU


def run_script(*args: str, path: str) -> subprocess.CompletedProcess:
    # no CUDA device for torch, whatever this machine has: the fake nvidia-smi's GPU is the one these tests mean
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path, "CUDA_VISIBLE_DEVICES": ""},
    )


def fake_nvidia_smi(folder: Path, listing: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '%s' '{listing}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return f"{folder}:/usr/bin:/bin"


def test_gpu_check_stops_at_once_without_an_nvidia_driver(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "sed", "grep", "dirname", "mktemp", "wc"):  # the script's own needs, no nvidia-smi
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bare / tool).symlink_to(found)
    result = run_script(path=str(bare))
    assert result.returncode == 3 and "no NVIDIA GPU here: nvidia-smi is not installed" in result.stderr, result.stderr
    assert "nothing was run" in result.stderr and not result.stdout


def test_gpu_check_stops_when_the_driver_lists_no_gpu(tmp_path):
    result = run_script(path=fake_nvidia_smi(tmp_path / "bin", "No devices were found"))
    assert result.returncode == 3 and "lists none (No devices were found)" in result.stderr


def test_gpu_check_arguments(tmp_path):
    path = fake_nvidia_smi(tmp_path / "bin", "GPU 0: Tesla P40 (UUID: GPU-1)")
    helped = run_script("--help", path=path)
    assert helped.returncode == 0 and "--window-s" in helped.stdout and "3 no NVIDIA GPU" in helped.stdout
    for bad in (["--bogus"], ["--gpu", "x"], ["--window-s", "0"]):
        assert run_script(*bad, path=path).returncode == 2, bad
    missing = run_script("--gpu", "1", path=path)
    assert missing.returncode == 2 and "--gpu 1: no such GPU" in missing.stderr and "Tesla P40" in missing.stderr
    # with a GPU listed, the script hands over to bench.gpu_check, which stops where torch sees no CUDA device
    handed = run_script("--dir", str(tmp_path / "work"), "--python", sys.executable, "--window-s", "1", path=path)
    assert "using GPU 0" in handed.stdout
    assert handed.returncode == 3 and "torch sees no CUDA device" in handed.stderr, handed.stderr[-2000:]
