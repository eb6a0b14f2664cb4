"""Nothing an RPC reaches blocks the agent's event loop (issue 30, item 6): a job's log read on a disk that does not answer,
an engine log or a model file replaced by a FIFO, and no `async def` in the agent calling a blocking function itself.

The ticks are the agent's own 1 Hz loop, noted as they run (as tests/e2e/gpusupport/test_gpu_support.py's R4 test does): while a read
hangs, they keep coming with a gap under 2 s."""

from __future__ import annotations

import os
import threading

import yaml

from agents.orchestra.engines.llamacpp.engine import LlamacppEngine, gguf_problem
from agents.wire.lab.model import parse_lab


def test_an_engine_log_or_model_file_replaced_by_a_fifo_is_never_waited_on(tmp_path):
    """models.get reads the engine's log on the loop and the doctor reads a GGUF's header in its thread: a FIFO put in
    either's place (nobody writes it) is refused at the open, at once."""
    lab = parse_lab(
        yaml.safe_dump(
            {
                "lab": "t",
                "machines": [{"name": "box"}],
                "models": [{"name": "m", "engine": "llamacpp", "machine": "box", "path": str(tmp_path / "m.gguf")}],
            }
        )
    )
    fifo = tmp_path / "engine.log"
    os.mkfifo(fifo)
    engine = LlamacppEngine(lab.models[0], tmp_path / "m.gguf", "box", [], fifo)
    done = threading.Event()
    results: list[object] = []

    def read() -> None:
        results.extend([engine.log_text(), engine.log_tail(5), gguf_problem(fifo)])
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(20), "a FIFO was waited on"
    assert results[:2] == ["", []] and "not a regular file (a FIFO)" in str(results[2]), results
