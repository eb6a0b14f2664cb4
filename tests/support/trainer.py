"""What tests/e2e/train/test_on_real_gpus.py, tests/e2e/train/test_trainer.py, tests/fast/train/test_on_real_gpus.py
share: REPO, DEMO_DATA, trainer_env, write_config."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


DEMO_DATA = REPO / "demo" / "train.jsonl"


# ---------------------------------------------------------------------------- helpers


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CETLAB_PROGRESS_FILE"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(extra)
    return env


def write_config(folder: Path, model: Path, **keys) -> Path:
    config = {
        "base_model": str(model),
        "dataset": str(DEMO_DATA),
        "output_dir": "out",  # relative: resolves against this file's folder
        "max_seq_len": 32,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "per_device_batch_size": 4,
        "max_steps": 6,
        "learning_rate": 1e-3,
        "save_steps": 3,
        "logging_steps": 1,
        "seed": 0,
        **keys,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
