"""What tests/e2e/orchestra/test_command_engine.py, tests/fast/orchestra/test_command_engine.py share: P4, SERVER,
LAB, command_lab, lab."""

from __future__ import annotations

import sys

import pytest
import yaml

from agents.shell.demo.lab import DemoLab

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


# the sim server as any server is given: its argv, with the agent's placeholders; no cetlab flag of its own
SERVER = [
    sys.executable,
    "-m",
    "agents.orchestra.engines.vllm.twin",
    "{model}",
    "--uds",
    "{socket}",
    "--served-model-name",
    "{name}",
    "--load-s",
    "0.1",
    "--cold-factor",
    "1",
    "--warmup-s",
    "0.1",
    "--tokens-per-s",
    "0",
]


LAB = {
    "lab": "command-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P4]}}],
    "models": [
        {
            "name": "any",
            "path": "models/any",
            "engine": "command",
            "machine": "node",
            "gpus": [0],
            "vram_gib": 1,
            "command": SERVER,
            "health_path": "/health",
        }
    ],
    "gateway": {"machine": "hub"},
}


def command_lab(**model: object) -> str:
    entry = {**LAB["models"][0], **model}
    return yaml.safe_dump({**LAB, "models": [entry]}, sort_keys=False)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmdsrc")
    (folder / "weights").mkdir()
    (folder / "weights" / "model.safetensors").write_bytes(b"\0" * 4096)  # what the server reads as it loads
    source = folder / "lab.yaml"
    source.write_text(command_lab(path=str(folder / "weights")))
    with DemoLab(tmp_path_factory.mktemp("cmd"), source=source) as demo:
        yield demo
