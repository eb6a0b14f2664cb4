"""vLLM as it really is: flags, environment, sleep level 2, runtime LoRA, logs; the sim engine holds the same contract."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from agents.orchestra.engine import process_vram_bytes
from agents.orchestra.engines.vllm.engine import SimEngine, VllmEngine, adapter_problem
from agents.wire.protocol import GpuProcess, GpuSample
from tests.support.vllm import adapter, model

pytestmark = pytest.mark.timeout(120)


GiB = 1024**3


# ---------------------------------------------------------------------------- how vLLM is started


def test_vllm_is_found_beside_the_agents_python_first(tmp_path, monkeypatch):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    vllm = venv_bin / "vllm"
    vllm.write_text("#!/bin/sh\n")
    vllm.chmod(vllm.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # systemd's PATH: no venv in it
    engine = VllmEngine(model(engine="vllm"), Path("/models/llama"), "box", [0], tmp_path / "log", gpu_total_bytes=24 * GiB)
    engine.check()
    assert engine.argv()[:3] == [str(vllm), "serve", "/models/llama"]


def test_vllm_flags_enable_lora_silence_access_logs_and_the_sim_gets_the_same(tmp_path):
    lab_model = model(engine="vllm", max_loras=2, max_lora_rank=64, args=["--max-model-len", "4096"])
    vllm = VllmEngine(lab_model, Path("/models/llama"), "box", [0], tmp_path / "log", gpu_total_bytes=24 * GiB)
    argv = vllm.argv()
    flags = argv[3:]
    assert flags[flags.index("--max-loras") + 1] == "2" and flags[flags.index("--max-lora-rank") + 1] == "64"
    for flag in ("--enable-lora", "--enable-sleep-mode", "--disable-uvicorn-access-log"):
        assert flag in flags
    assert flags[-2:] == ["--max-model-len", "4096"] and flags[flags.index("--gpu-memory-utilization") + 1] == "0.34"
    sim = SimEngine(lab_model, Path("/models/llama"), "box", [0], tmp_path / "log", gpu_total_bytes=24 * GiB)
    assert sim.address == vllm.address  # the same socket: the run folder beside the same log
    assert sim.argv()[3:4] == ["/models/llama"] and sim.argv()[4 : 4 + len(flags)] == flags  # started the way vLLM is
    no_lora = VllmEngine(model(engine="vllm", max_loras=0), Path("/m"), "box", [0], tmp_path / "log").argv()
    assert "--enable-lora" not in no_lora


@pytest.mark.parametrize(("inherited", "kept"), [("expandable_segments:True", False), ("max_split_size_mb:512", True)])
def test_engine_env_orders_gpus_by_pci_and_strips_expandable_segments(tmp_path, monkeypatch, inherited, kept):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", inherited)
    for cls in (VllmEngine, SimEngine):
        env = cls(model(), Path("/m"), "box", [3, 1], tmp_path / "log").env()
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "3,1"
        assert env["VLLM_SERVER_DEV_MODE"] == "1"
        assert ("PYTORCH_CUDA_ALLOC_CONF" in env) is kept


def test_load_phases_read_vllm_0_33_seconds_too(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "INFO Loading weights took 1.50 s\n"
        "INFO Model loading took 2.31 GiB memory and 3.25 s\n"
        "INFO Graph capturing finished in 7 secs, took 0.40 GiB\n"
        "INFO init engine (profile, create kv cache, warmup model) took 12.00 s\n"
    )
    engine = VllmEngine(model(engine="vllm"), Path("/m"), "box", [0], log)
    assert engine.load_phases() == {"weights_s": 1.5, "model_load_s": 3.25, "graph_capture_s": 7.0, "init_engine_s": 12.0}
    log.write_text("INFO Loading weights took 1.50 seconds\nINFO Model loading took 2.3 GiB and 3.25 seconds\n")
    assert engine.load_phases() == {"weights_s": 1.5, "model_load_s": 3.25}


# ---------------------------------------------------------------------------- adapters


def test_adapter_problem_says_why_and_offers_the_merge(tmp_path):
    served = model(max_lora_rank=16)
    assert adapter_problem(adapter(tmp_path / "ok", r=16), served) is None
    demo = adapter_problem(adapter(tmp_path / "demo", modules_to_save=["embed_tokens", "lm_head"]), served)
    assert "modules_to_save (embed_tokens, lm_head)" in demo and "merged" in demo
    wide = adapter_problem(adapter(tmp_path / "wide", r=64), served)
    assert "rank 64" in wide and "max_lora_rank 16" in wide and "merged" in wide
    assert "--enable-lora" in adapter_problem(tmp_path / "ok", model(max_loras=0))
    assert "adapter config" in adapter_problem(tmp_path / "missing", served)


def test_vram_per_model_is_summed_from_nvmls_per_process_memory():
    samples = [
        GpuSample(
            index=0,
            name="Tesla P40",
            processes=[
                GpuProcess(pid=10, mem_used_bytes=700 * 2**20),
                GpuProcess(pid=11, mem_used_bytes=GiB),
                GpuProcess(pid=99, mem_used_bytes=5 * GiB),
            ],
        ),
        GpuSample(index=1, name="Tesla P40", processes=[GpuProcess(pid=11, mem_used_bytes=None)]),
        GpuSample(index=2, name="Tesla P4", processes=[GpuProcess(pid=10, mem_used_bytes=GiB)]),
    ]
    assert process_vram_bytes(samples, [10, 11], [0, 1]) == {0: 700 * 2**20 + GiB, 1: 0}
    assert process_vram_bytes(samples, [12], [0, 1]) is None  # NVML shows nothing of it: no measurement
