"""vLLM as it really is: flags, environment, sleep level 2, runtime LoRA, logs; the sim engine holds the same contract."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.orchestra import engine as engine_module
from agents.orchestra.engine import EngineRequestFailed
from agents.orchestra.engines.vllm.engine import AdapterNotLoadable, SimEngine
from tests.support.pool import engine_http
from tests.support.vllm import adapter, model
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


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
