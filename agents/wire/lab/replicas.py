"""A model's placements: its own machine and GPUs, then each of lab.yaml's `replicas:` (one per machine).

Every agent runs the placement on its own machine as its own instance of the model, under the model's name: the
placement is the model entry with that machine, GPUs and port. The gateway spreads requests over the placements.
A machine runs one placement of a model: its pool, its ticks and its commands know a model by name on a machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from agents.wire.lab.gpu_numbers import gpu_number_problems

if TYPE_CHECKING:
    from agents.wire.lab.model import Lab, Model


class _Machine(Protocol):
    name: str

    @property
    def gpu_count(self) -> int | None: ...


def placements(model: Model) -> list[Model]:
    """The model as each machine that runs it runs it: its own entry first, then one per replica."""
    if not model.replicas:
        return [model]
    return [model] + [
        model.model_copy(update={"machine": r.machine, "gpus": list(r.gpus), "port": r.port}) for r in model.replicas
    ]


def placement_on(model: Model, machine: str) -> Model | None:
    """The model as ``machine`` runs it, or None where it has no placement there."""
    return next((p for p in placements(model) if p.machine == machine), None)


def models_on(lab: Lab, machine: str) -> list[Model]:
    """The models ``machine``'s agent runs: each as placed there (a replica's machine, GPUs and port)."""
    return [p for m in lab.models if (p := placement_on(m, machine)) is not None]


def machines_of(model: Model) -> list[str]:
    return [p.machine for p in placements(model)]


def replicas_cross_check(models: list[Model], machines: Mapping[str, _Machine]) -> list[tuple[tuple[str | int, ...], str]]:
    """Each replica on a machine of the lab, with the GPUs it names, and on a machine that runs no other placement."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for i, model in enumerate(models):
        taken = {model.machine}
        for j, replica in enumerate(model.replicas):
            where = ("models", i, "replicas", j)
            machine = machines.get(replica.machine)
            if machine is None:
                problems.append(((*where, "machine"), f"no machine named {replica.machine!r} (machines: {', '.join(machines)})"))
                continue
            if replica.machine in taken:
                problems.append(
                    (
                        (*where, "machine"),
                        f"{model.name} already has a placement on {replica.machine}: one per machine (a machine's agent "
                        f"knows a model by its name); for more GPUs of {replica.machine}, list them in that placement's gpus, "
                        "or add a second model entry with its own name",
                    )
                )
            taken.add(replica.machine)
            problems += gpu_number_problems(replica.machine, machine.gpu_count, replica.gpus, (*where, "gpus"))
    return problems
