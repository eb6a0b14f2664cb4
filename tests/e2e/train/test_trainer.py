"""cetlab-train end to end: real trainer processes on the tiny model, plus the pieces they rest on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.train.config import ConfigError, load_config
from agents.train.progress import read_progress, write_progress
from tests.support.trainer import DEMO_DATA, REPO, trainer_env, write_config
from tests.support.waits import wait_until

pytestmark = pytest.mark.slow


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agents.train", *args]


def run_trainer(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(*args), cwd=REPO, env=trainer_env(**env), capture_output=True, text=True, timeout=timeout)


def global_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from agents.train.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def first_run(tiny_model, tmp_path_factory):
    """One real 6-step run (save every 3 steps), shared by the tests below."""
    folder = tmp_path_factory.mktemp("run")
    config = write_config(folder, tiny_model)
    proc = run_trainer("--config", str(config))
    return folder, proc


# ---------------------------------------------------------------------------- real runs


def test_trains_saves_checkpoints_and_reports_progress(first_run):
    folder, proc = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = folder / "out"
    for step in (3, 6):
        checkpoint = out / f"checkpoint-{step}"
        assert (checkpoint / "adapter_model.safetensors").is_file()
        assert global_step(checkpoint) == step

    progress = read_progress(out / "progress.json")
    assert progress is not None
    output = proc.stdout + proc.stderr  # the job's log: each logged step in words, never a Python dict
    assert "cetlab-train: step 1/6  loss " in output and "{'loss'" not in output, output[-2000:]
    assert "is_gradient_checkpointing" not in output  # peft's use of a deprecated transformers property: not the job's business
    assert progress["state"] == "finished"
    assert progress["stop_reason"] == "max_steps"
    assert progress["step"] == progress["max_steps"] == 6
    assert isinstance(progress["pid"], int)
    assert isinstance(progress["loss"], float) and progress["loss"] > 0
    assert isinstance(progress["learning_rate"], float)
    assert progress["tokens_per_s"] > 0 and progress["samples_per_s"] > 0
    assert progress["eta_s"] == 0 and progress["elapsed_s"] > 0
    assert progress["error"] is None
    # what the trainer's device implies (fp32 on the CPU, bf16 on an H100 ...), and the run says why: the device asked
    # as the trainer asks, in a process of its environment (this one's torch may see another, or be told otherwise)
    from agents.train.precision import plan_precision

    probe = "import json; from agents.train.precision import device_capability; print(json.dumps(device_capability()))"
    asked = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=trainer_env(), capture_output=True, text=True)
    capability, name = json.loads(asked.stdout)
    capability = tuple(capability) if capability else None
    expected = plan_precision("auto", capability, tf32=False, torch_compile=False, device_name=name)
    assert progress["precision"] == expected.precision and expected.notes[0] in progress["notes"], progress["notes"]
    saved = {c["step"]: c for c in progress["checkpoints"]}
    assert sorted(saved) == [3, 6]
    for step, entry in saved.items():
        assert Path(entry["path"]) == out / f"checkpoint-{step}"
        assert isinstance(entry["save_s"], float) and 0 <= entry["save_s"] < 60
        assert entry["at"] <= progress["updated_at"]


def test_resume_continues_the_step_count(first_run, tmp_path):
    folder, proc = first_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = tmp_path / "resumed"
    proc = run_trainer(
        "--config",
        str(folder / "train.yaml"),
        "--resume-from-checkpoint",
        str(folder / "out" / "checkpoint-3"),
        "--max-steps",
        "9",
        "--output-dir",
        str(resumed),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert global_step(resumed / "checkpoint-9") == 9
    assert global_step(resumed / "checkpoint-6") == 6
    state = json.loads((resumed / "checkpoint-9" / "trainer_state.json").read_text())
    logged = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert logged == list(range(1, 10))  # steps 1-3 from the checkpoint, then 4-9
    progress = read_progress(resumed / "progress.json")
    assert progress["state"] == "finished" and progress["step"] == 9 and progress["max_steps"] == 9


def test_sigterm_stops_cleanly_with_a_checkpoint(tiny_model, tmp_path):
    config = write_config(tmp_path, tiny_model, max_steps=5000, save_steps=10000)
    progress_file = tmp_path / "elsewhere" / "status.json"  # the agent's override
    proc = subprocess.Popen(
        train_cmd("--config", str(config)),
        cwd=REPO,
        env=trainer_env(CETLAB_PROGRESS_FILE=str(progress_file)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def reported_a_step() -> bool:
            assert proc.poll() is None, f"the trainer exited before reporting a step: {proc.poll()=}"
            return ((read_progress(progress_file) or {}).get("step") or 0) >= 1

        wait_until(reported_a_step, 90)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert not (tmp_path / "out" / "progress.json").exists()
    doc = read_progress(progress_file)
    assert doc["state"] == "finished"
    assert doc["stop_reason"] == "signal:SIGTERM"
    assert 1 <= doc["step"] < 5000
    last = tmp_path / "out" / f"checkpoint-{doc['step']}"
    assert global_step(last) == doc["step"]
    assert (last / "adapter_model.safetensors").is_file()
    assert doc["checkpoints"][-1]["path"] == str(last)


def test_a_failing_run_reports_failed(tiny_model, tmp_path):
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes((tiny_model / "model.safetensors").read_bytes()[:1000])
    config = write_config(tmp_path, broken)
    proc = run_trainer("--config", str(config))
    assert proc.returncode == 1
    doc = read_progress(tmp_path / "out" / "progress.json")
    assert doc["state"] == "failed" and doc["error"] and "\n" not in doc["error"]
    assert doc["error"] in proc.stderr


# ---------------------------------------------------------------------------- bad configs


def test_unknown_key_is_one_clear_line(tiny_model, tmp_path):
    config = write_config(tmp_path, tiny_model, learning_rat=1e-3)
    progress_file = tmp_path / "p.json"
    proc = run_trainer("--config", str(config), CETLAB_PROGRESS_FILE=str(progress_file))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "learning_rat" in lines[0] and "unknown key" in lines[0] and str(config) in lines[0]
    assert "did you mean 'learning_rate'" in lines[0]
    assert "Traceback" not in proc.stderr
    doc = read_progress(progress_file)
    assert doc["state"] == "failed" and "learning_rat" in doc["error"]


def test_missing_dataset_names_the_key_and_file(tiny_model, tmp_path):
    config = write_config(tmp_path, tiny_model, dataset="nope.jsonl")
    proc = run_trainer("--config", str(config))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "dataset" in lines[0] and str(tmp_path / "nope.jsonl") in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_config_file_and_bad_value(tiny_model, tmp_path):
    proc = run_trainer("--config", str(tmp_path / "absent.yaml"))
    assert proc.returncode == 2 and "absent.yaml" in proc.stderr and "Traceback" not in proc.stderr
    config = write_config(tmp_path, tiny_model, lora={"r": 0})
    proc = run_trainer("--config", str(config))
    assert proc.returncode == 2 and "lora.r" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- pieces


def test_progress_module_is_light_and_tolerant(tmp_path):
    probe = "import sys, agents.train.progress; print(sorted(m for m in ('torch', 'transformers', 'peft', 'yaml', 'pydantic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=trainer_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

    path = tmp_path / "p.json"
    assert read_progress(path) is None
    path.write_text('{"state": "runn')  # half-written
    assert read_progress(path) is None
    path.write_text("[1, 2]")
    assert read_progress(path) is None
    write_progress(path, {"state": "running", "step": 3})
    doc = read_progress(path)
    assert doc["state"] == "running" and doc["step"] == 3 and doc["pid"] == os.getpid()
    assert doc["checkpoints"] == [] and doc["updated_at"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name != "p.json"]  # no temp files left
    with pytest.raises(ValueError):
        write_progress(path, {"state": "dancing"})


def test_config_paths_overrides_and_env(tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "data.jsonl").write_text('{"text": "hi"}\n')
    path = tmp_path / "cfg" / "train.yaml"
    path.parent.mkdir()
    path.write_text("base_model: ../m\ndataset: ../data.jsonl\noutput_dir: run\npretokenized_cache: cache\n")
    config = load_config(path, env={})
    assert Path(config.base_model) == model
    assert config.dataset == tmp_path / "data.jsonl"
    assert config.output_dir == path.parent / "run"
    assert config.progress_file == path.parent / "run" / "progress.json"
    assert config.pretokenized_cache == path.parent / "cache"
    assert (config.max_seq_len, config.lora.r, config.lora.target_modules, config.logging_steps) == (
        256,
        8,
        ["q_proj", "v_proj"],
        1,
    )
    assert (config.max_steps, config.dataloader_workers, config.resume_from_checkpoint, config.cpu_threads) == (-1, 0, None, None)

    monkeypatch.chdir(tmp_path)
    config = load_config(
        path,
        {"output_dir": "cli-out", "max_steps": 7, "lora.r": 4, "resume_from_checkpoint": "latest"},
        env={"CETLAB_PROGRESS_FILE": "status.json"},
    )
    assert config.output_dir == tmp_path / "cli-out"  # command-line paths: against the cwd
    assert (config.max_steps, config.lora.r, config.resume_from_checkpoint) == (7, 4, "latest")
    assert config.progress_file == tmp_path / "status.json"

    with pytest.raises(ConfigError, match=r"train.yaml: max_steps \(from the command line\)"):
        load_config(path, {"max_steps": 0}, env={})
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint \(from the command line\): checkpoint folder not found"):
        load_config(path, {"resume_from_checkpoint": "nowhere"}, env={})
    path.write_text("base_model: ../m\ndataset: ../data.jsonl\noutput_dir: run\nlora:\n  rank: 4\n")
    with pytest.raises(ConfigError, match=r"train.yaml:5: lora.rank: unknown key"):
        load_config(path, env={})
    path.write_text("base_model: ../nothing-here\ndataset: ../data.jsonl\noutput_dir: run\n")
    with pytest.raises(ConfigError, match="base_model: model folder not found"):
        load_config(path, env={})
    path.write_text("base_model: org/some-model\ndataset: ../data.jsonl\noutput_dir: run\n")
    assert load_config(path, env={}).base_model == "org/some-model"  # a Hub id stays as is


def test_tokenization_masks_prompts_and_cache_is_reused(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from agents.train.data import DataError, PadCollator, build_dataset

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "Capital of France:", "completion": " Paris"}\n\n{"text": "hello world"}\n')
    messages: list[str] = []
    cache = tmp_path / "cache"
    rows = build_dataset(data, tokenizer, 64, cache, log=messages.append)
    assert len(rows) == 2
    first = rows[0]
    n_prompt = len(tokenizer("Capital of France:")["input_ids"])
    assert first["input_ids"][0] == tokenizer.bos_token_id and first["input_ids"][-1] == tokenizer.eos_token_id
    assert (first["labels"][:n_prompt] == -100).all()
    assert tokenizer.decode(first["labels"][n_prompt:], skip_special_tokens=True) == " Paris"
    assert (rows[1]["labels"] == rows[1]["input_ids"]).all()
    assert (cache / "tokenized.pt").is_file()

    again = build_dataset(data, tokenizer, 64, cache, log=messages.append)
    assert "reusing" in messages[-1] and (again.ids == rows.ids).all()
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))  # the dataset changed
    build_dataset(data, tokenizer, 64, cache, log=messages.append)
    assert "stale" in " ".join(messages[-3:])

    batch = PadCollator(tokenizer.pad_token_id)([rows[0], rows[1]])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape

    data.write_text('{"prompt": "x"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:1: expected"):
        build_dataset(data, tokenizer, 64, None, log=messages.append)


def test_tiny_model_and_demo_files(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from agents.train.tiny import demo_jsonl, ensure_demo, make_tiny_model

    assert make_tiny_model(tiny_model) == tiny_model  # idempotent
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|assistant|>\n")
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == len(tokenizer)

    # the committed demo dataset is the generator's output, and the demo config loads
    assert DEMO_DATA.read_text() == demo_jsonl()
    assert len(DEMO_DATA.read_text().splitlines()) == 200
    demo = load_config(REPO / "demo" / "train.yaml", env={})
    assert demo.make_tiny_if_missing and Path(demo.base_model) == REPO / ".cetlab-demo" / "tiny-llama"

    # ensure_demo lays out a self-contained recipe (the model is linked by copying the made one)
    import shutil

    shutil.copytree(tiny_model, tmp_path / "demo" / "tiny-llama")
    yaml_path = ensure_demo(tmp_path / "demo")
    cfg = load_config(yaml_path, env={})
    assert Path(cfg.base_model) == tmp_path / "demo" / "tiny-llama" and cfg.dataset.read_text() == demo_jsonl()
