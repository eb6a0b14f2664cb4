"""`cetlab-agent doctor` knows what this machine's lab.yaml entry needs: each model's engine binary, its weights
present and in a format the engine loads (a GGUF whose header reads), the ports it names; each failure with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from agents.runtime.keys import HOST_KEY_NAME, ensure_key
from agents.shell.demo.lab import free_ports

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


def doctor(lab: Path, state: Path, llama_server: Path) -> tuple[int, dict[str, dict[str, str]]]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.shell.daemon",
            "doctor",
            "--lab",
            str(lab),
            "--machine",
            "box",
            "--state-dir",
            str(state),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CETLAB_LLAMA_SERVER": str(llama_server)},  # where the agent looks first
    )
    report = json.loads(result.stdout)
    return result.returncode, {c["name"]: c for c in report["checks"]}


def test_doctor_fails_on_a_missing_llama_server_and_gguf_and_on_a_file_that_is_no_gguf(tmp_path):
    agent_port, gateway_port = free_ports(2)
    lab = tmp_path / "lab.yaml"
    lab.write_text(
        yaml.safe_dump(
            {
                "lab": "day-one",
                "machines": [{"name": "box", "host": "127.0.0.1", "port": agent_port, "gpus": {"sim": [P4]}}],
                "models": [{"name": "tiny", "path": "models/tiny.gguf", "engine": "llamacpp", "machine": "box"}],
                "gateway": {"machine": "box", "port": gateway_port},
            }
        )
    )
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    ensure_key(state / HOST_KEY_NAME)
    binary = tmp_path / "bin" / "llama-server"

    code, checks = doctor(lab, state, binary)
    assert code == 1
    server = checks["llama-server (tiny)"]
    assert server["level"] == "FAIL" and "-m agents.orchestra.engines.llamacpp.build" in server["message"], server
    weights = checks["model tiny"]
    assert weights["level"] == "FAIL" and f"{tmp_path / 'models' / 'tiny.gguf'} does not exist" in weights["message"], weights
    assert "hf download" in weights["message"]
    assert checks["agent port"]["level"] == "OK" and checks["gateway port"]["level"] == "OK"

    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF stand-in: the doctor looks for it, never runs it")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF")
    code, checks = doctor(lab, state, binary)
    assert code == 1
    assert checks["llama-server (tiny)"]["level"] == "OK" and "cpu" in checks["llama-server (tiny)"]["message"]
    header = checks["model tiny gguf"]
    assert header["level"] == "FAIL" and "not a GGUF file" in header["message"] and "convert_hf_to_gguf" in header["message"]

    (tmp_path / "models" / "tiny.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    code, checks = doctor(lab, state, binary)
    assert code == 0, {n: c for n, c in checks.items() if c["level"] == "FAIL"}
    assert checks["model tiny"]["level"] == "OK" and "model tiny gguf" not in checks


def test_a_plain_script_recipe_without_torch_is_a_warning_and_a_gpu_recipe_a_failure(tmp_path):
    """A recipe's Python without torch FAILs only where the recipe certainly imports it (on GPUs, under torchrun, or
    cetlab's own trainer); a plain script may not need torch: a WARN saying so, not a FAIL."""
    from agents.shell.doctor import FAIL, WARN, check_trainers
    from agents.wire.lab.model import Lab

    bare = tmp_path / "bare"  # a Python with no torch: a venv of its own, without system site-packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")

    def recipe(name: str, **more: object) -> dict[str, object]:
        return {"name": name, "machine": "box", "command": [python, "job.py"], "output_dir": str(tmp_path / name), **more}

    def level(trainer: dict[str, object]) -> str:
        lab = Lab.model_validate({"lab": "t", "machines": [{"name": "box", "host": "127.0.0.1"}], "trainers": [trainer]})
        (check,) = check_trainers(lab, "box")
        return check.level

    assert level(recipe("plain")) == WARN  # before: FAIL, for a script that never imports torch
    assert level(recipe("on-gpu", gpus=[0])) == FAIL
    assert level(recipe("ddp", launcher="torchrun")) == FAIL
