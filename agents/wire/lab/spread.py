"""One llama.cpp model over several machines (lab.yaml's `rpc:`): the helper placements, their checks, and which agent
calls which with the node role (a multi-node recipe's first node its other nodes; a spread model's machine its helpers).

A helper machine's agent runs llama.cpp's rpc-server for the model, bound to 127.0.0.1 only (rpc-server has no
authentication: it never listens on the network); the model's machine reaches it through its own SSH link to that agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from agents.wire.lab.gpu_numbers import gpu_number_problems
from agents.wire.schema import Name, Strict

if TYPE_CHECKING:
    from agents.wire.lab.machines import Machine
    from agents.wire.lab.model import Lab

RPC_ENGINES = ("llamacpp", "sim-llamacpp")  # llama-server's --rpc; the twin's helpers run a simulated rpc-server


class RpcHelper(Strict):
    """A machine whose GPUs lend memory to a llama.cpp model served on another (its rpc-server, on those GPUs)."""

    machine: Name
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)  # empty: its CPU backend


Problem = tuple[tuple[str | int, ...], str]


def cross_check(lab: Lab) -> list[Problem]:
    """Every model's rpc: a llama.cpp engine, helper machines that exist, each once, none the model's own, GPUs present."""
    machines: dict[str, Machine] = {m.name: m for m in lab.machines}
    problems: list[Problem] = []
    for i, model in enumerate(lab.models):
        if not model.rpc:
            continue
        if model.engine not in RPC_ENGINES:
            problems.append(
                (("models", i, "rpc"), f"rpc: spreads a llama.cpp model; engine {model.engine} cannot (use engine: llamacpp)")
            )
        if model.replicas:  # each replica would need helpers of its own: not planned, so refused rather than half-done
            problems.append(
                (("models", i, "rpc"), "a model spread with rpc: has no replicas: (make a second model entry for another copy)")
            )
        seen: set[str] = set()
        for j, helper in enumerate(model.rpc):
            where = ("models", i, "rpc", j, "machine")
            machine = machines.get(helper.machine)
            if machine is None:
                problems.append((where, f"no machine named {helper.machine!r} (machines: {', '.join(machines)})"))
                continue
            if helper.machine == model.machine:
                problems.append((where, f"{helper.machine} runs the model itself: list its GPUs in the model's gpus"))
            if helper.machine in seen:
                problems.append((where, f"machine {helper.machine} is a helper twice"))
            seen.add(helper.machine)
            problems += gpu_number_problems(machine.name, machine.gpu_count, helper.gpus, ("models", i, "rpc", j, "gpus"))
    return problems


def node_links(lab: Lab) -> list[tuple[str, str]]:
    """(caller, callee): the agents that call another with the node role, each pair once: a multi-node recipe's first node
    calls its other nodes, a spread model's machine calls its rpc helpers."""
    pairs: list[tuple[str, str]] = []
    for trainer in lab.trainers:
        nodes = [n.machine for n in trainer.nodes]
        pairs += [(nodes[0], other) for other in nodes[1:]]
    for model in lab.models:
        pairs += [(model.machine, helper.machine) for helper in model.rpc]
    return list(dict.fromkeys(pairs))


def helped_models(lab: Lab, machine: str) -> list[str]:
    """The models whose rpc: names ``machine`` as a helper."""
    return [m.name for m in lab.models if any(h.machine == machine for h in m.rpc)]
