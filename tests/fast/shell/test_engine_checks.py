"""The transformers pin, doctor's engine checks, and the GPU check script where there is no GPU."""

from __future__ import annotations

import importlib.metadata
import tomllib

import pytest
from packaging.requirements import Requirement

from agents.orchestra.engines.transformers.engine import TransformersEngine
from tests.support.lab import REPO


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
