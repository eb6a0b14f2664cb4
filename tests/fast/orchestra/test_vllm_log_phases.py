"""vLLM's load phases read from both spellings of its log lines, never raising."""

from __future__ import annotations

from types import SimpleNamespace


def test_load_phases_read_both_vllm_spellings_and_never_raise(tmp_path):
    from agents.orchestra.engine import Engine

    log = tmp_path / "engine.log"
    log.write_text(
        "Loading weights took 12.50 s\n"  # vLLM 0.33
        "init engine (profile, create kv cache, warmup model) took 3.25 seconds\n"  # vLLM 0.11
        "Graph capturing finished in 1.2.3 secs\n"  # garbage: no phase
        f"warm-up (first forward pass) took {'9' * 400} seconds\n"  # infinite as a float: no phase
    )
    from agents.orchestra.engines.vllm.engine import VLLM_SPEC

    engine = SimpleNamespace(log_text=lambda: log.read_text(), spec=VLLM_SPEC)  # vLLM's load-phase lines, from its spec
    phases = Engine.load_phases(engine)
    assert phases == {"weights_s": 12.5, "init_engine_s": 3.25}
