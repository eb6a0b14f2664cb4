"""The trainer on the lab's real GPUs, by stand-ins: precision by compute capability, ranks that stop together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agents.train import trainer as trainer_module
from agents.train.config import load_config
from agents.train.progress import read_progress
from tests.support.trainer import trainer_env, write_config
from tests.support.waits import wait_until

# (compute capability, GPU) of the lab's cards
RTX_3050, V100, P40, H100 = ((8, 6), "RTX 3050"), ((7, 0), "Tesla V100"), ((6, 1), "Tesla P40"), ((9, 0), "H100")


@pytest.mark.slow
def test_bf16_on_a_v100_fails_the_run_with_the_reason(tmp_path, monkeypatch):
    from agents.train.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    monkeypatch.setattr(trainer_module, "device_capability", lambda: V100)  # the stubbed device
    config = load_config(write_config(tmp_path / "run", model, precision="bf16"), env={})
    assert trainer_module.run(config) == 2
    progress = read_progress(config.progress_file)
    assert progress["state"] == "failed" and "compute capability 7.0" in progress["error"] and "Tesla V100" in progress["error"]


@pytest.mark.slow
def test_a_p40_trains_in_fp32_with_tf32_and_compile_turned_off_not_crashing(tmp_path, monkeypatch):
    from agents.train.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    monkeypatch.setattr(trainer_module, "device_capability", lambda: P40)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the stub is the device: not a real GPU in its place
    config = load_config(write_config(tmp_path / "run", model, max_steps=2, save_steps=2, tf32=True, torch_compile=True), env={})
    assert trainer_module.run(config) == 0
    progress = read_progress(config.progress_file)
    assert progress["state"] == "finished" and progress["precision"] == "fp32"
    assert any("Triton" in note for note in progress["notes"]) and any(note.startswith("tf32 off") for note in progress["notes"])


# ---------------------------------------------------------------------------- ranks stop together


def _rank_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get("RANK")
    except psutil.Error:
        return None


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_both_at_the_same_step(tmp_path):
    """Two CPU ranks (gloo) under torchrun; only rank 1 gets SIGTERM: both save the same step and exit 0."""
    from agents.train.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny")
    config = write_config(tmp_path / "run", model, max_steps=100000, save_steps=100000, per_device_batch_size=2)
    progress_file = tmp_path / "progress.json"
    cetlab_train = str(Path(sys.executable).with_name("cetlab-train"))
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--no-python",
        cetlab_train,
        "--config",
        str(config),
    ]
    log = tmp_path / "torchrun.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            torchrun,
            # CPU ranks on a GPU workstation too: its one GPU cannot take two ranks (rank 1 would ask for cuda:1)
            env=trainer_env(CETLAB_PROGRESS_FILE=str(progress_file), CUDA_VISIBLE_DEVICES=""),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def two_steps() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return ((read_progress(progress_file) or {}).get("step") or 0) >= 2

        wait_until(two_steps, 240, interval=0.2, what=f"two steps; log: {log}")
        ranks = {_rank_of(p): p for p in psutil.Process(proc.pid).children(recursive=True)}
        ranks["1"].send_signal(signal.SIGTERM)
        assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    finished = [line.split("finished at step ")[1].split()[0] for line in text.splitlines() if "finished at step" in line]
    assert len(finished) == 2 and finished[0] == finished[1], text[-3000:]
    step = int(finished[0])
    done = read_progress(progress_file)
    assert done["state"] == "finished" and done["step"] == step and done["stop_reason"] == "signal:SIGTERM"
    checkpoint = tmp_path / "run" / "out" / f"checkpoint-{step}"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
