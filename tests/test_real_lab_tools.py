"""The transformers pin, doctor's engine checks, and the GPU check script where there is no GPU."""

from __future__ import annotations

import importlib.metadata
import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agents.orchestra.engines.transformers.engine import TransformersEngine
from tests.conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"


def train_extra(name: str) -> Requirement:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(Requirement(r) for r in extras["train"] if Requirement(r).name == name)


def test_the_train_extra_pins_a_transformers_whose_serve_the_engine_can_drive():
    pin = train_extra("transformers")
    assert "serving" in pin.extras
    # 5.5 took the model as a positional argument; 5.6 added /v1/completions, which the warm-up calls
    assert not pin.specifier.contains("4.56.0") and not pin.specifier.contains("5.5.0") and pin.specifier.contains("5.6.0")
    installed = importlib.metadata.version("transformers")
    assert pin.specifier.contains(installed), f"the venv has transformers {installed}, outside the pin {pin}"


@pytest.mark.parametrize(("version", "level"), [("5.23.0", "OK"), ("5.6.0", "OK"), ("5.5.1", "FAIL"), ("4.56.2", "FAIL")])
def test_doctor_fails_a_transformers_too_old_to_serve(monkeypatch, version, level):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    check = TransformersEngine.install_check(needed=True)
    assert check is not None and check.ok == (level == "OK") and version in check.message
    if level == "FAIL":
        assert ">=5.6" in check.message


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


def test_gpu_check_reads_a_recorded_status_of_a_real_gpu():
    """bench/gpu_check.py against `cetlab --json status` and the agent's `status` as an H100 box gave them (KeyError 'processes' before)."""
    import json

    from agents.wire.catalogue.agent import StatusReply
    from bench import gpu_check
    from console.lab.status import STATUS_GPU_KEYS

    recorded = json.loads((REPO / "tests" / "data" / "gpu_check_status.json").read_text())
    status, agent_status = recorded["status --json"], recorded["agent status"]
    assert set(status["machines"][0]["gpus"][0]) == STATUS_GPU_KEYS  # the recording is what the CLI prints today
    lines = gpu_check.gpu_lines(status, 0, StatusReply.model_validate(agent_status))
    assert lines[0].startswith("GPU 0 NVIDIA H100 80GB HBM3: util 100.0%, power 512.3 W, 1634 MiB used, 41.0 C"), lines
    assert lines[1].startswith("  pid 48211 ubuntu 1088 MiB python -c"), lines
    assert gpu_check.gpu_lines(status, 0)[1] == "  processes: not asked (the agent's `status` lists them)"
    agent_status["gpus"][0]["processes"] = []
    assert gpu_check.gpu_lines(status, 0, StatusReply.model_validate(agent_status))[1] == "  no process holds it"
