"""vLLM as it really is: flags, environment, sleep level 2, runtime LoRA, logs; the sim engine holds the same contract."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from agents.orchestra import engine as engine_module
from agents.orchestra.engine import EngineRequestFailed, process_vram_bytes
from agents.orchestra.engines.vllm.engine import AdapterNotLoadable, SimEngine, VllmEngine, adapter_problem
from agents.wire.lab.model import Model
from agents.wire.lab.model import SimEngine as SimDelays
from agents.wire.protocol import GpuProcess, GpuSample
from tests.conftest import wait_for
from tests.pool_fixtures import engine_http

pytestmark = pytest.mark.timeout(120)
FAST = SimDelays(load_s=0.0, warmup_s=0.0, wake_s=0.0, tokens_per_s=0)
GiB = 1024**3


def model(**fields) -> Model:
    return Model(
        **{
            "name": "llama",
            "path": "/models/llama",
            "engine": "sim",
            "machine": "box",
            "gpus": [0],
            "vram_gib": 8.0,
            "sim": FAST,
            **fields,
        }
    )


def adapter(folder: Path, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, **config}))
    return folder


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


# ---------------------------------------------------------------------------- the sim engine holds vLLM's contract


def request(engine, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    """At the engine's own address (its unix socket), as the agent asks it."""
    return engine_http(engine.address.endpoint.removesuffix("/v1") + path, body, method)


async def started(engine: SimEngine, env: dict[str, str] | None = None) -> SimEngine:
    if env is not None:
        engine.env = lambda: env  # type: ignore[method-assign]
    await engine.start()
    await wait_for_health(engine)
    return engine


async def wait_for_health(engine) -> None:
    async def healthy() -> bool:
        if await engine.health():
            return True
        assert engine.proc.returncode is None, engine.log_text()
        return False

    try:
        await wait_for(healthy, timeout=40)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{engine.log_text()}") from None


def completion(engine) -> str:
    status, body = request(
        engine, "POST", "/v1/completions", {"model": engine.served_name, "prompt": "The capital of France is", "max_tokens": 6}
    )
    assert status == 200, body
    return json.loads(body)["choices"][0]["text"]


@pytest.fixture
def weights(tmp_path) -> Path:
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    return folder


async def test_sleep_level_2_wakes_with_reloaded_weights_and_a_bare_wake_answers_garbage(tmp_path, weights):
    engine = await started(SimEngine(model(sleep_level=2), weights, "box", [0], tmp_path / "sim.log"))
    try:
        sense = completion(engine)
        assert sense.strip() and "!" not in sense
        await engine.sleep(2)
        assert await engine.is_sleeping()
        await engine.wake()  # the agent: wake weights, reload_weights, wake kv_cache
        assert not await engine.is_sleeping() and completion(engine) == sense
        # what the agent did before: a bare /wake_up after level 2 serves garbage, as vLLM does
        await engine.sleep(2)
        assert request(engine, "POST", "/wake_up")[0] == 200
        assert completion(engine) == "!" * 6
        log = engine.log_text()
        assert "weights reloaded" in log and "GET /metrics" not in log
    finally:
        await engine.stop()


async def test_a_level_2_wake_is_refused_where_vllm_has_no_reload_weights(tmp_path, weights):
    engine = await started(SimEngine(model(sleep_level=2), weights, "box", [0], tmp_path / "sim.log"))
    try:
        await engine.sleep(2)

        async def no_rpc(method, path, body=None, timeout_s=10.0):
            if path == "/collective_rpc":
                raise EngineRequestFailed("POST /collective_rpc answered 404: Not Found")
            return await type(engine).http(engine, method, path, body, timeout_s)

        engine.http = no_rpc  # type: ignore[method-assign]
        with pytest.raises(EngineRequestFailed, match="use sleep_level: 1"):
            await engine.wake()
    finally:
        await engine.stop()


async def test_sleep_routes_exist_only_in_vllm_dev_mode(tmp_path, weights):
    plain = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    engine = await started(SimEngine(model(), weights, "box", [0], tmp_path / "sim.log"), env=plain)
    try:
        for method, path in (
            ("POST", "/sleep?level=1"),
            ("POST", "/wake_up"),
            ("GET", "/is_sleeping"),
            ("POST", "/collective_rpc"),
        ):
            assert request(engine, method, path, {} if method == "POST" else None)[0] == 404, path
        assert request(engine, "POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})[0] == 404
        assert completion(engine)
    finally:
        await engine.stop()


async def test_runtime_lora_needs_enable_lora_and_a_rank_that_fits(tmp_path, weights):
    small = adapter(tmp_path / "small", r=8)
    wide = adapter(tmp_path / "wide", r=32)
    demo = adapter(tmp_path / "demo", modules_to_save=["lm_head"])
    without = await started(SimEngine(model(max_loras=0), weights, "box", [0], tmp_path / "a.log"))
    try:
        status, body = request(without, "POST", "/v1/load_lora_adapter", {"lora_name": "small", "lora_path": str(small)})
        assert status == 400 and b"--enable-lora" in body
    finally:
        await without.stop()
    engine = await started(SimEngine(model(max_lora_rank=16), weights, "box", [0], tmp_path / "b.log"))
    try:
        await engine.load_adapter("small", str(small))
        status, body = request(engine, "POST", "/v1/load_lora_adapter", {"lora_name": "wide", "lora_path": str(wide)})
        assert status == 400 and b"greater than max_lora_rank 16" in body  # the sim refuses as vLLM does
        for name, path in (("wide", wide), ("demo", demo)):
            with pytest.raises(AdapterNotLoadable, match="merged"):  # the agent says why before asking
                await engine.load_adapter(name, str(path))
        ids = [m["id"] for m in json.loads(request(engine, "GET", "/v1/models")[1])["data"]]
        assert ids == [engine.served_name, "small"]
    finally:
        await engine.stop()


# ---------------------------------------------------------------------------- logs and measured memory


async def test_engine_logs_rotate_as_job_logs_do(tmp_path, weights, monkeypatch):
    monkeypatch.setattr(engine_module, "LOG_MAX_BYTES", 2048)
    log = tmp_path / "sim.log"
    log.write_text("x" * 4096 + "\n")  # an earlier run's log, over the limit
    engine = await started(SimEngine(model(), weights, "box", [0], log))
    try:
        assert (tmp_path / "sim.log.1").stat().st_size > 4096
        for _ in range(3):  # a chatty engine, and the agent polling /metrics
            with open(log, "ab") as out:
                out.write(b"INFO engine chatter\n" * 120)
            await engine.metrics()
        assert (tmp_path / "sim.log.3").exists() and log.stat().st_size < 2048
        assert "cetlab starts" in (tmp_path / "sim.log.3").read_text()
        await engine.sleep(1)  # the engine goes on writing into the rotated file, from its start
        assert "engine put to sleep" in log.read_text() and "\0" not in log.read_text()
        assert "engine put to sleep" in engine.log_text()
    finally:
        await engine.stop()


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
