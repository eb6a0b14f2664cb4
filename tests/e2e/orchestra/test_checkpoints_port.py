"""The model pool and the checkpoints are built with a small core and meet only through the pool's port (ModelsPort).

The checkpoints run for real here (real runs on disk, real SQLite, their RPC methods) against a stand-in that provides
ModelsPort and nothing else: what the checkpoints may ask of the pool is that Protocol. The pool runs on the same
small core and answers the port with typed records (ModelView, ModelError).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from agents.checkpoints.component import CheckpointsComponent
from agents.orchestra.engines import engine_spec
from agents.orchestra.port import LoraConversion, ModelsPort, ModelView
from agents.runtime.rpc import Peer
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError, Role
from agents.wire.sections.models import ModelError, ModelInfo
from agents.wire.states import ModelState
from tests.support.checkpoints_port import small_core
from tests.support.small_core import SmallCore
from tests.support.waits import wait_for


class PoolStandIn:
    """Provides ModelsPort and nothing else: one warm vLLM model, `base`, whose engine can be restarted."""

    def __init__(self, base_path: Path) -> None:
        self.base = ModelView(
            name="base",
            model=Model(name="base", path=str(base_path), engine="vllm", machine="box"),
            path=base_path,
            state=ModelState.WARM,
            busy=False,
            spec=engine_spec("vllm"),
            engine_serial=1,
            endpoint="http://127.0.0.1:1/v1",
            error=None,
        )
        self.loaded: list[tuple[str, str, str]] = []

    def restart_engine(self) -> None:
        self.base = dataclasses.replace(self.base, engine_serial=(self.base.engine_serial or 0) + 1)

    def engine_ports(self) -> frozenset[int]:
        return frozenset()

    def engine_sockets(self) -> frozenset[str]:
        return frozenset()

    def rpc_ports(self) -> frozenset[int]:
        return frozenset()

    def holding_gpus(self) -> list[ModelInfo]:
        return []

    def view(self, name: str) -> ModelView:
        found = self.find_view(name)
        if found is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no model {name}")
        return found

    def find_view(self, name: str) -> ModelView | None:
        return self.base if name == "base" else None

    def adapter_host(self, base: Path) -> ModelView | None:
        return None

    def engine_spec(self, engine: str) -> Any:
        return engine_spec(engine)

    def engine_stack_kind(self, engine: str) -> Any:
        return engine_spec(engine).gpu_stack

    def engine_stack(self, engine: str, reader: Any) -> Any:
        raise AssertionError("not asked in this test (no GPU support check runs here)")

    def engine_stacks(self, reader: Any) -> list[Any]:
        raise AssertionError("not asked in this test (no GPU support check runs here)")

    def adapter_problem(self, name: str, adapter_dir: Path) -> str | None:
        return None

    async def load_adapter(self, name: str, adapter: str, path: str) -> None:
        self.loaded.append((name, adapter, path))

    def lora_conversion(self, adapter: Path, base: Path, out: Path) -> LoraConversion | None:
        return None

    def add_model(self, model: Model, path: Path) -> ModelView:
        raise AssertionError("not asked in this test")

    def remove_model(self, name: str) -> None:
        raise AssertionError("not asked in this test")

    async def bring_up(self, name: str) -> ModelView:
        raise AssertionError("not asked in this test")


async def call(core: SmallCore, method: str, params: dict[str, Any]) -> Any:
    reply = await core.rpc.dispatch(
        Peer(role=Role.OPERATOR, who="test", send=lambda line: None), {"id": 1, "method": method, "params": params}
    )
    assert "result" in reply, reply
    return reply["result"]


async def test_checkpoints_serve_an_adapter_through_the_models_port_and_see_the_engine_restart(tmp_path, hand_runs):
    pool = PoolStandIn(hand_runs)
    assert isinstance(pool, ModelsPort)
    core = small_core(tmp_path, f"checkpoints: {{dirs: [{{machine: box, path: {hand_runs / 'exp1'}}}]}}\n", parts=(pool,))
    component = CheckpointsComponent(core)
    await component.start()
    try:
        served = await call(core, "checkpoints.serve", {"run": "exp1", "step": 8, "model": "base"})
        assert served["mode"] == "adapter" and served["model"] == "base" and served["state"] == "warm"
        assert pool.loaded == [("base", "exp1-step8", str(hand_runs / "exp1" / "checkpoint-8"))]
        listed = await call(core, "checkpoints.list", {"run": "exp1"})
        step8 = next(c for c in listed["checkpoints"] if c["step"] == 8)
        assert step8["serving"] == {"model": "base", "mode": "adapter", "state": "warm", "error": None}
        assert step8["in_use"] == "served by model base (warm)"
        pool.restart_engine()  # the adapter went with the old engine
        listed = await call(core, "checkpoints.list", {"run": "exp1"})
        step8 = next(c for c in listed["checkpoints"] if c["step"] == 8)
        assert step8["serving"]["state"] == "unloaded" and step8["in_use"] is None
    finally:
        await component.stop()


class GgufPoolStandIn(PoolStandIn):
    """`base` is a llama.cpp model: serving an adapter on it converts the adapter to GGUF first (a child process that
    finishes when the test opens its gate). A cold model of the served name is left from an earlier serve."""

    def __init__(self, base_path: Path, gate: Path) -> None:
        super().__init__(base_path)
        self.base = dataclasses.replace(
            self.base,
            model=Model(name="base", path=str(base_path / "base.gguf"), engine="llamacpp", machine="box"),
            spec=engine_spec("llamacpp"),
        )
        self.old = dataclasses.replace(self.base, name="exp1-step8", state=ModelState.COLD, engine_serial=None, endpoint=None)
        self.gate = gate

    def find_view(self, name: str) -> ModelView | None:
        return {"base": self.base, self.old.name: self.old}.get(name)

    def lora_conversion(self, adapter: Path, base: Path, out: Path) -> LoraConversion | None:
        wait = (
            "import pathlib, sys, time\nfor _ in range(6000):\n    if pathlib.Path(sys.argv[1]).exists(): sys.exit(0)\n"
            "    time.sleep(0.01)\nsys.exit(1)\n"
        )
        return LoraConversion(argv=[sys.executable, "-c", wait, str(self.gate)], env=dict(os.environ), out=out)

    def remove_model(self, name: str) -> None:
        pass

    def add_model(self, model: Model, path: Path) -> ModelView:
        return self.old

    async def bring_up(self, name: str) -> ModelView:
        self.old = dataclasses.replace(self.old, state=ModelState.FAILED, error=ModelError(message="not in this test", t=1.0))
        return self.old

    def view(self, name: str) -> ModelView:
        found = self.find_view(name)
        assert found is not None
        return found


async def test_a_checkpoint_being_converted_for_llamacpp_is_served_and_in_use(tmp_path, hand_runs):
    """While its adapter is converted to GGUF the checkpoint is being served (agents/wire/served.py) and may not be deleted,
    and its record says `converting`, not the state of an older, cold model of the same name."""
    gate = tmp_path / "gate"
    pool = GgufPoolStandIn(hand_runs, gate)
    core = small_core(tmp_path, f"checkpoints: {{dirs: [{{machine: box, path: {hand_runs / 'exp1'}}}]}}\n", parts=(pool,))
    component = CheckpointsComponent(core)
    await component.start()
    try:
        served = await call(core, "checkpoints.serve", {"run": "exp1", "step": 8, "model": "base"})
        assert served["mode"] == "gguf-adapter" and served["state"] == "converting"
        listed = await call(core, "checkpoints.list", {"run": "exp1"})
        step8 = next(c for c in listed["checkpoints"] if c["step"] == 8)
        assert step8["serving"]["state"] == "converting"
        assert step8["in_use"] == "served by model exp1-step8 (converting)"
    finally:
        gate.touch()
        await wait_for(lambda: all(t.done() for t in component.serving.tasks), timeout=60)
        await component.stop()
