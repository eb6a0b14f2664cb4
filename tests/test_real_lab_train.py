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
from agents.train.config import ConfigError, load_config
from agents.train.precision import PrecisionRefused, compute_dtype, plan_precision
from agents.train.progress import read_progress
from tests.conftest import wait_until
from tests.test_train import trainer_env, write_config

# (compute capability, GPU) of the lab's cards
RTX_3050, V100, P40, H100 = ((8, 6), "RTX 3050"), ((7, 0), "Tesla V100"), ((6, 1), "Tesla P40"), ((9, 0), "H100")


@pytest.mark.parametrize(
    ("gpu", "expected"), [(H100, "bf16"), (RTX_3050, "bf16"), (V100, "fp16"), (P40, "fp32"), ((None, "CPU"), "fp32")]
)
def test_auto_precision_follows_the_compute_capability(gpu, expected):
    plan = plan_precision("auto", gpu[0], tf32=False, torch_compile=False, device_name=gpu[1])
    assert plan.precision == expected
    assert plan.notes and expected in plan.notes[0] and gpu[1] in plan.notes[0]


def test_qlora_compute_dtype_follows_the_precision():
    import torch

    expected = {H100: torch.bfloat16, V100: torch.float16, P40: torch.float32}
    for gpu, dtype in expected.items():
        assert compute_dtype(plan_precision("auto", gpu[0], tf32=False, torch_compile=False).precision) == dtype


def test_explicit_bf16_below_ampere_is_refused_with_the_reason():
    for capability, name in (V100, P40):
        with pytest.raises(PrecisionRefused, match=rf"bf16 needs compute capability 8.0.*{name}"):
            plan_precision("bf16", capability, tf32=False, torch_compile=False, device_name=name)
    assert plan_precision("bf16", RTX_3050[0], tf32=False, torch_compile=False).precision == "bf16"
    with pytest.raises(PrecisionRefused, match="fp16 needs a CUDA GPU"):
        plan_precision("fp16", None, tf32=False, torch_compile=False)


def test_tf32_and_compile_only_where_they_work():
    p40 = plan_precision("auto", P40[0], tf32=True, torch_compile=True, device_name=P40[1])
    assert (p40.tf32, p40.torch_compile) == (False, False)
    assert any(n.startswith("tf32 off") for n in p40.notes) and any(n.startswith("torch_compile off: Triton") for n in p40.notes)
    v100 = plan_precision("fp16", V100[0], tf32=True, torch_compile=True)
    assert (v100.tf32, v100.torch_compile) == (False, True)
    ampere = plan_precision("auto", RTX_3050[0], tf32=True, torch_compile=True)
    assert (ampere.tf32, ampere.torch_compile) == (True, True) and len(ampere.notes) == 1


def test_the_old_bf16_key_says_what_replaced_it(tmp_path):
    config = write_config(tmp_path, tmp_path / "no-model", bf16=True)
    with pytest.raises(ConfigError, match="replaced by precision: auto"):
        load_config(config)


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
