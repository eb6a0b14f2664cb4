"""What tests/e2e/gateway/test_routes.py share: model."""

from __future__ import annotations

from tests.support.gateway import SIM


def model(name: str, engine: str, gpu: int, serves: str = "chat") -> dict:
    return {
        "name": name,
        "path": f"models/{name}" + (".gguf" if engine == "sim-llamacpp" else ""),
        "engine": engine,
        "machine": "hub",
        "gpus": [gpu],
        "vram_gib": 1,
        "serves": serves,
        "sim": SIM,
    }
