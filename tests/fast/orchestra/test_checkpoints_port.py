"""The model pool and the checkpoints are built with a small core and meet only through the pool's port (ModelsPort).

The checkpoints run for real here (real runs on disk, real SQLite, their RPC methods) against a stand-in that provides
ModelsPort and nothing else: what the checkpoints may ask of the pool is that Protocol. The pool runs on the same
small core and answers the port with typed records (ModelView, ModelError).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents.orchestra.component import SCHEMA, OrchestraComponent
from agents.orchestra.port import ModelsPort
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.models import ModelError, Serving
from agents.wire.states import ModelState
from tests.support.checkpoints_port import small_core


def test_a_serving_record_has_a_known_mode_and_state():
    assert Serving(model="m", mode="gguf-adapter", state="converting").state == "converting"
    assert Serving(model="m", mode="merged", state="warming").state == ModelState.WARMING
    with pytest.raises(ValidationError):
        Serving(model="m", mode="adapter", state="half-loaded")
    with pytest.raises(ValidationError):
        Serving(model="m", mode="sideways", state="warm")


def test_the_pool_answers_its_port_and_a_failure_is_a_typed_model_error(tmp_path):
    core = small_core(
        tmp_path, "models: [{name: tiny, path: /nonexistent/tiny, engine: sim, machine: box, gpus: [0], vram_gib: 1}]\n"
    )
    pool = OrchestraComponent(core)
    assert isinstance(pool, ModelsPort)
    core.store.migrate(pool.name, SCHEMA)
    view = pool.view("tiny")
    assert view.state == ModelState.COLD and view.engine_serial is None and view.spec.name == "sim"
    with pytest.raises(RemoteError) as refused:
        pool.view("elsewhere")
    assert refused.value.code == ErrorCode.NOT_FOUND
    slot = pool.slot("tiny")
    pool.lifecycle.fail(slot, None, "the engine exited with code 1")
    assert isinstance(slot.error, ModelError) and pool.view("tiny").error == slot.error
    info = pool.info(slot).to_wire()
    assert info["state"] == "failed"
    assert info["error"] == {
        "message": "the engine exited with code 1",
        "exit_code": None,
        "oom": False,
        "log_tail": [],
        "log_path": None,
        "t": slot.error.t,
    }
    assert core.events and core.events[-1][1].level == "error"
