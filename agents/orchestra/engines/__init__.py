"""The engines cetlab can run, by lab.yaml's `engine:` name: the one list of them.

Each engine is one folder beside this one: engine.py (its spec, command line, stack probe, metrics mapping), its simulated twin,
its build and model-file helpers; adding an engine is a copy of command/ and one entry here. lab.yaml's `engine:` is checked against ENGINES when the agent
loads it (agents.wire.lab.model.parse_lab's ``engines``); the wire carries the name as a plain string.
"""

from __future__ import annotations

from agents.orchestra.engine import Engine
from agents.orchestra.engines.command.engine import CommandEngine
from agents.orchestra.engines.llamacpp.engine import LlamacppEngine, SimLlamacppEngine
from agents.orchestra.engines.transformers.engine import TransformersEngine
from agents.orchestra.engines.vllm.engine import SimEngine, VllmEngine
from agents.orchestra.spec import EngineSpec
from agents.runtime.torch_probe import TorchReader
from agents.wire.sections.gpu_support import Stack, StackKind

ENGINES: dict[str, type[Engine]] = {
    cls.spec.name: cls for cls in (SimEngine, VllmEngine, TransformersEngine, LlamacppEngine, SimLlamacppEngine, CommandEngine)
}


def engine_class(name: str) -> type[Engine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"no engine named {name!r} (engines: {', '.join(ENGINES)})") from None


def engine_spec(name: str) -> EngineSpec:
    """What the engine named in lab.yaml can do (the gateway, checkpoints and doctor ask this, never the name)."""
    return engine_class(name).spec


def installed_stacks(reader: TorchReader) -> list[Stack]:
    """The GPU stacks of this machine's real engines, each read by its engine (blocking: subprocesses, cached by ``reader``).

    The torch stack is the trainers' (the GPU support check reads that itself); simulated engines run on no GPU."""
    stacks = []
    for cls in ENGINES.values():
        if not cls.spec.simulated and cls.spec.gpu_stack not in (None, StackKind.TORCH):
            stack = cls.stack(reader)
            if stack is not None:
                stacks.append(stack)
    return stacks
