"""The trainer writes where a run diverged."""

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
