"""What the real-lab and typed-state work left to join: divergence from the trainer, vLLM's log lines, systemd's line."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

from agents.train.progress import read_progress
from agents.wire.documents import Progress, load_quietly


def test_the_trainer_writes_where_a_run_diverged(tmp_path):
    from agents.train.trainer import Reporter, StopFlag, make_callback

    reporter = Reporter(tmp_path / "progress.json", started=time.monotonic())
    callback = make_callback(reporter, StopFlag(), samples_per_step=1)
    args, control = SimpleNamespace(device="cpu"), SimpleNamespace(should_log=False)
    for step, loss in ((5, 2.5), (6, math.nan), (7, math.inf)):
        state = SimpleNamespace(global_step=step, max_steps=10, epoch=0.5, num_input_tokens_seen=0)
        callback.on_log(args, state, control, logs={"loss": loss, "learning_rate": 1e-4})
    doc = read_progress(tmp_path / "progress.json")
    assert doc["loss"] is None and doc["diverged_at_step"] == 6  # the first step whose loss was not a number
    parsed = load_quietly(tmp_path / "progress.json", Progress)
    assert parsed is not None and parsed.diverged_at_step == 6


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


def test_systemd_status_line_counts_from_the_typed_sections():
    from agents.shell.systemd import status_line
    from agents.wire.sections.jobs import JobInfo
    from agents.wire.sections.models import ModelInfo, ModelsSection

    def job(state: str) -> JobInfo:
        return JobInfo.model_validate(
            {
                "id": f"box-{state}",
                "recipe": "r",
                "machine": "box",
                "gpus": [0],
                "state": state,
                "started_at": 0.0,
                "output_dir": "/runs",
                "log_path": "/runs/log",
            }
        )

    def model(state: str) -> ModelInfo:
        return ModelInfo.model_validate(
            {"name": f"m-{state}", "machine": "box", "engine": "sim", "gpus": [0], "state": state, "since": 0.0}
        )

    agent = SimpleNamespace(
        peers=[SimpleNamespace(closed=False)],
        latest=None,
        interval_s=1.0,
        simulated=False,
        current={
            "jobs": [job("running"), job("exited"), job("stopping")],
            "models": ModelsSection(models=[model("warm"), model("sleeping")]),
        },
    )
    assert status_line([agent]).startswith("1 console, 2 jobs, 1 model warm, 0 GPUs, sampling 1 Hz")
