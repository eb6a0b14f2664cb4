"""What tests/e2e/bench/test_benches.py, tests/e2e/cli/test_verb_words.py, tests/e2e/lab/test_rotation_words.py,
tests/e2e/orchestra/test_start_plan.py, tests/e2e/tui/test_lab_view.py, tests/e2e/tui/test_make_demo.py share: PY,
FAST, sim_model, box_lab, cli, SAVER, saver_lab."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agents.shell.demo.lab import DemoLab

PY = sys.executable


FAST = {"load_s": 0.2, "warmup_s": 0.3, "wake_s": 0.1, "tokens_per_s": 400, "placeholder_mib": 2}


def sim_model(name: str, gpu: int) -> dict:
    return {"name": name, "path": f"models/{name}", "engine": "sim", "machine": "box", "gpus": [gpu], "vram_gib": 4, "sim": FAST}


@pytest.fixture(scope="module")
def box_lab(tmp_path_factory):
    """One machine with two sim models on a 4 h rotation and a trainer that prints a line: its agent running."""
    root = tmp_path_factory.mktemp("first-hour")
    data = {
        "lab": "first-hour",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}] * 2}}],
        "models": [sim_model("a", 0), sim_model("b", 1)],
        "orchestra": {"warm": ["a"], "rotate_every": "4h", "rotation": [["b"], ["a"]]},
        "trainers": [{"name": "hello", "machine": "box", "command": [PY, "-c", "print('hello')"], "output_dir": "runs/{job_id}"}],
    }
    (root / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(root / "run", source=root / "lab.yaml") as demo:
        yield demo


def cli(lab: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "console.cli.main", "--lab", str(lab), *args], capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------------------- 13: the demo's lab file, kept

SAVER = """import json, pathlib, sys
ckpt = pathlib.Path(sys.argv[1]) / "checkpoint-2"
ckpt.mkdir(parents=True)
(ckpt / "adapter_model.safetensors").write_bytes(b"weights")
(ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [{"step": 2, "loss": 1.5}]}))
print("saved", ckpt)
"""


def saver_lab(root: Path) -> Path:
    """A one-machine demo source whose trainer writes one checkpoint (real files) and exits."""
    data = {
        "lab": "kept-lab",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "trainers": [
            {"name": "saver", "machine": "box", "command": [PY, "-c", SAVER, "{output_dir}"], "output_dir": "runs/{job_id}"}
        ],
        "checkpoints": {"poll_s": 1, "settle_s": 0},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "lab.yaml"
