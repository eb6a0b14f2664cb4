"""The engines cetlab can run, by lab.yaml's `engine:` name. Adding an engine: its module, one line here, its lab.yaml name."""

from __future__ import annotations

from agents.orchestra.engine import Engine
from agents.orchestra.llamacpp import LlamacppEngine, SimLlamacppEngine
from agents.orchestra.sim_engine import SimEngine
from agents.orchestra.spec import EngineSpec
from agents.orchestra.transformers_engine import TransformersEngine
from agents.orchestra.vllm import VllmEngine

ENGINES: dict[str, type[Engine]] = {
    cls.spec.name: cls for cls in (SimEngine, VllmEngine, TransformersEngine, LlamacppEngine, SimLlamacppEngine)
}


def engine_class(name: str) -> type[Engine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"no engine named {name!r} (engines: {', '.join(ENGINES)})") from None


def engine_spec(name: str) -> EngineSpec:
    """What the engine named in lab.yaml can do (the gateway, checkpoints and doctor ask this, never the name)."""
    return engine_class(name).spec
