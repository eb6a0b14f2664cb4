"""What tests/e2e/orchestra/test_vllm.py, tests/fast/orchestra/test_vllm.py share: FAST, model, adapter."""

from __future__ import annotations

import json
from pathlib import Path

from agents.wire.lab.model import Model
from agents.wire.lab.model import SimEngine as SimDelays

FAST = SimDelays(load_s=0.0, warmup_s=0.0, wake_s=0.0, tokens_per_s=0)


def model(**fields) -> Model:
    return Model(
        **{
            "name": "llama",
            "path": "/models/llama",
            "engine": "sim",
            "machine": "box",
            "gpus": [0],
            "vram_gib": 8.0,
            "sim": FAST,
            **fields,
        }
    )


def adapter(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, **config}))
    return folder
