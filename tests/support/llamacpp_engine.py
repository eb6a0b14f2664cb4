"""What tests/e2e/orchestra/test_llamacpp.py, tests/fast/orchestra/test_llamacpp.py share: engine_for."""

from __future__ import annotations

from pathlib import Path

from agents.orchestra.engines.llamacpp.engine import LlamacppEngine
from agents.wire.lab.model import Model


def engine_for(model: dict, gpus: list[int], totals: list[int] | None = None) -> LlamacppEngine:
    engine = LlamacppEngine(
        Model.model_validate({"machine": "m5", "engine": "llamacpp", **model}),
        Path(model["path"]),
        "m5",
        gpus,
        Path("/tmp/x.log"),
    )
    engine.gpu_totals = totals
    return engine
