"""A model's replicas as the CLI (`cetlab models`) and the Orchestra view show them: side by side, and which is which."""

from __future__ import annotations

from agents.wire.lab.model import Lab
from agents.wire.lab.replicas import machines_of
from agents.wire.sections.models import ModelInfo


def grouped(models: list[ModelInfo]) -> list[ModelInfo]:
    """A model's placements side by side, where its first one is; the order otherwise as it came (machine by machine)."""
    by_name: dict[str, list[ModelInfo]] = {}
    for model in models:
        by_name.setdefault(model.name, []).append(model)
    return [m for placed in by_name.values() for m in placed]


def replica_machines(lab: Lab, model: ModelInfo) -> list[str]:
    """The machines of a model's placements (lab.yaml's machine and replicas); [] for a model of one placement."""
    entry = next((m for m in lab.models if m.name == model.name), None)
    return machines_of(entry) if entry is not None and entry.replicas else []
