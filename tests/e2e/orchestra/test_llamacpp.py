"""The engine interface and the llama.cpp engine: specs instead of names, llama-server's flags and metrics,
the simulated llama-server's contract, and the real pinned llama-server through the pool and the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
from pathlib import Path

import psutil
import pytest
import yaml

from agents.orchestra.engines.llamacpp.engine import lora_files, tensor_split
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.lab import HOUR_S, age
from tests.support.llamacpp import llama_server_or_skip, tiny_models
from tests.support.llamacpp_engine import engine_for
from tests.support.pool import FAST, engine_http, pool_lab, post, settle
from tests.support.waits import wait_for

GIB = 1024**3


def test_llama_server_flags_split_a_model_over_gpus_by_their_memory():
    seventy = engine_for({"name": "llama-70b", "path": "/m/70b.gguf", "port": 8080}, [1, 2, 3, 4], [24 * GIB] * 4)
    argv = seventy.argv()
    assert argv[1:3] == ["-m", "/m/70b.gguf"]
    flags = argv[3:]
    assert flags[flags.index("--port") + 1] == "8080" and flags[flags.index("--alias") + 1] == "llama-70b"
    assert "--metrics" in flags and flags[flags.index("-ngl") + 1] == "999"
    assert flags[flags.index("--split-mode") + 1] == "layer" and flags[flags.index("--tensor-split") + 1] == "24,24,24,24"
    assert seventy.env()["CUDA_VISIBLE_DEVICES"] == "1,2,3,4"
    assert tensor_split([24 * GIB, 8 * GIB]) == "24,8"  # a P40 and a P4: three layers of four on the P40
    cpu = engine_for({"name": "tiny", "path": "/m/t.gguf", "args": ["--lora", "/a/x.gguf,/a/y.gguf", "-ngl", "10"]}, [])
    flags = cpu.argv()
    assert (
        "--split-mode" not in flags and flags.count("-ngl") == 1 and flags[flags.index("-ngl") + 1] == "10"
    )  # lab.yaml's args win
    assert lora_files(cpu.model.args) == ["/a/x.gguf", "/a/y.gguf"]


# ---------------------------------------------------------------------------- the simulated llama-server


def http(url: str, body: object | None = None) -> tuple[int, str]:
    status, raw = engine_http(url, body)
    return status, raw.decode()


async def test_sim_llamacpp_holds_llama_servers_contract(run_pool):
    demo = run_pool(
        pool_lab(
            [
                {
                    "name": "p40-7b",
                    "path": "models/p40-7b.Q4_K_M.gguf",
                    "engine": "sim-llamacpp",
                    "machine": "box",
                    "gpus": [0],
                    "vram_gib": 5,
                    "args": ["--sleep-idle-seconds", "1"],
                    "sim": {**FAST},
                },
                {
                    "name": "p4-3b",
                    "path": "models/p4-3b.Q8_0.gguf",
                    "engine": "sim-llamacpp",
                    "machine": "box",
                    "gpus": [1],
                    "vram_gib": 4,
                    "sim": {**FAST},
                },
            ],
            orchestra={"sleeping": ["p4-3b"]},
        )
    )
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        # in the start plan's `sleeping`, a llama.cpp model (no sleep mode) is kept in RAM instead: never brought up
        p4 = await settle(client, "p4-3b", ("cached",))
        assert p4["load_s"] is None and p4["cached_fraction"] >= 0.9
        await client.call("box", "models.warm", {"model": "p40-7b"})
        info = await settle(client, "p40-7b", ("warm", "failed"))
        assert info["state"] == "warm" and info["simulated"] is True and info["engine"] == "sim-llamacpp"
        assert info["can_sleep"] is False  # the console refuses `s` on it before asking
        base = info["endpoint"].removesuffix("/v1")
        status, answer = await asyncio.to_thread(
            post, info["endpoint"], "/v1/completions", {"model": "p40-7b", "prompt": "hi", "max_tokens": 5}
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        status, metrics = await asyncio.to_thread(http, base + "/metrics")
        assert status == 200 and "llamacpp:tokens_predicted_total 13" in metrics  # the warm-up 8 + 5 and "vllm:" not in metrics
        for route in ("/sleep", "/wake_up", "/v1/load_lora_adapter"):  # vLLM's routes: llama-server has none of them
            assert (await asyncio.to_thread(http, base + route, {}))[0] == 404
        await wait_for(lambda: json.loads(http(base + "/props")[1])["is_sleeping"], 15)  # its own idle sleep
        status, answer = await asyncio.to_thread(
            post, info["endpoint"], "/v1/completions", {"model": "p40-7b", "prompt": "hi", "max_tokens": 3}
        )
        assert status == 200 and not json.loads(http(base + "/props")[1])["is_sleeping"]  # a task wakes it
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.sleep", {"model": "p40-7b"})
        assert exc.value.code == ErrorCode.UNAVAILABLE and "no sleep mode" in exc.value.message
        info = await client.call("box", "models.cold", {"model": "p40-7b"}, timeout=30)
        assert info["state"] == "cached"  # the GGUF stays in the page cache: the next load reads it from RAM


# ---------------------------------------------------------------------------- the real llama-server


@pytest.fixture(scope="module")
def llama_lab(tmp_path_factory):
    llama_server_or_skip()
    models = tiny_models(tmp_path_factory.mktemp("gguf"))
    second, spare = models["lora"].with_name("second.gguf"), models["lora"].with_name("not-named-at-start.gguf")
    shutil.copy(models["lora"], second)
    shutil.copy(models["lora"], spare)
    args = ["-c", "256", "-t", "1", "--parallel", "2"]
    lab = {
        "lab": "llama-lab",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {
                "name": "tiny-a",
                "path": str(models["a"]),
                "engine": "llamacpp",
                "machine": "box",
                "load_timeout_s": "60s",
                "args": [*args, "--lora", f"{models['lora']},{second}"],
            },
            {
                "name": "tiny-b",
                "path": str(models["b"]),
                "engine": "llamacpp",
                "machine": "box",
                "load_timeout_s": "60s",
                "args": [*args, "--sleep-idle-seconds", "2"],
            },
            {"name": "hf-folder", "path": str(models["a"].parent), "engine": "llamacpp", "machine": "box"},
        ],
        "gateway": {"machine": "box"},
    }
    source = tmp_path_factory.mktemp("llamasrc") / "lab.yaml"
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path_factory.mktemp("llama"), source=source) as demo:
        yield demo, models, spare


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_real_llama_server_warm_tokens_metrics_adapter_swap_gateway_idle_sleep(llama_lab):
    from openai import AsyncOpenAI

    demo, models, spare = llama_lab
    lab = load_lab(demo.lab_path)
    async with FleetClient(lab) as client:
        await client.wait_connected(20)
        await client.call("box", "models.warm", {"model": "tiny-a"})
        a = await settle(client, "tiny-a", ("warm", "failed"), timeout=90)
        assert a["state"] == "warm", a["error"]
        assert a["simulated"] is False and a["engine"] == "llamacpp"
        # the real llama-server took --host PATH.sock as its socket: it listens there, in its 0700 run folder, and on no port
        socket = a["endpoint"].removeprefix("unix:")
        assert a["endpoint"].startswith("unix:/") and stat.S_IMODE(os.stat(os.path.dirname(socket)).st_mode) == 0o700
        server = next(p for p in psutil.process_iter(["cmdline"]) if socket in (p.info["cmdline"] or []))
        assert not [c for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert "model_load_s" in (await client.call("box", "models.get", {"model": "tiny-a"}))["load_phases"]
        # real tokens from llama.cpp's forward pass
        status, answer = await asyncio.to_thread(
            post, a["endpoint"], "/v1/completions", {"model": "tiny-a", "prompt": "The capital of France is", "max_tokens": 8}
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 8 and answer["choices"][0]["text"]
        # its llamacpp:* counters become the console's figures (warm-up 8 + this request 8 tokens)

        async def counted() -> bool:
            got = await client.call("box", "models.get", {"model": "tiny-a"})
            return (got["generation_tokens_total"] or 0) >= 16 and (got["prompt_tokens_total"] or 0) > 0

        await wait_for(counted, 30, interval=0.5)
        # no sleep on request: the pool says so, and stopping it leaves the GGUF in the page cache
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.sleep", {"model": "tiny-a"})
        assert exc.value.code == ErrorCode.UNAVAILABLE and "no sleep mode" in exc.value.message
        # of the GGUF adapters named at start (all at scale 1), one is selected at run time; one not named is refused
        lora_url = a["endpoint"].removesuffix("/v1") + "/lora-adapters"
        assert [x["scale"] for x in json.loads((await asyncio.to_thread(http, lora_url))[1])] == [1.0, 1.0]
        await client.call("box", "models.adapter", {"model": "tiny-a", "name": "style", "path": str(models["lora"])})
        assert [(x["id"], x["scale"]) for x in json.loads((await asyncio.to_thread(http, lora_url))[1])] == [(0, 1.0), (1, 0.0)]
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.adapter", {"model": "tiny-a", "name": "other", "path": str(spare)})
        assert "only at start" in exc.value.message
        # a swap: tiny-a out (stopped, its process group gone), tiny-b in
        await client.call("box", "models.swap", {"out": "tiny-a", "in": "tiny-b"})
        b = await settle(client, "tiny-b", ("warm", "failed"), timeout=90)
        assert b["state"] == "warm", b["error"]
        a = await client.call("box", "models.get", {"model": "tiny-a"})
        assert a["state"] in ("cold", "cached") and a["endpoint"] is None
        # through the gateway with the official SDK, streamed and not
        gateway = AsyncOpenAI(
            base_url=f"http://{lab.gateway.host}:{lab.gateway.port}/v1",
            api_key=(demo.dir / "console" / "gateway.key").read_text().strip(),
        )
        reply = await gateway.completions.create(model="tiny-b", prompt="Once upon a time", max_tokens=6)
        assert reply.usage is not None and reply.usage.completion_tokens == 6 and reply.choices[0].text
        chunks = [c async for c in await gateway.completions.create(model="tiny-b", prompt="Hello", max_tokens=5, stream=True)]
        assert "".join(c.choices[0].text for c in chunks if c.choices)
        await gateway.close()

        # the gateway meters it like any engine: requests, errors, its own TTFT (llama-server has no TTFT series)
        async def metered() -> dict | None:
            figures = {m["name"]: m for m in (await client.call("box", "gateway.status"))["models"]}["tiny-b"]
            return figures if figures["requests"] == 2 else None

        figures = await wait_for(metered, 20)
        assert figures["errors"] == 0 and figures["p50_ttft_s"] is not None and not figures["simulated"]
        # llama-server's own idle sleep (--sleep-idle-seconds 2): the model leaves memory, the next task reloads it
        props = b["endpoint"].removesuffix("/v1") + "/props"
        await wait_for(lambda: json.loads(http(props)[1]).get("is_sleeping"), 30, interval=0.2)
        status, answer = await asyncio.to_thread(
            post, b["endpoint"], "/v1/completions", {"model": "tiny-b", "prompt": "Hi", "max_tokens": 4}
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 4
        assert json.loads(http(props)[1])["is_sleeping"] is False
        # a Hugging Face folder is not a GGUF: refused before anything starts
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.warm", {"model": "hf-folder"})
        assert exc.value.code == ErrorCode.UNAVAILABLE and ".gguf" in exc.value.message
        await client.call("box", "models.cold", {"model": "tiny-b"}, timeout=30)


# ---------------------------------------------------------------------------- a trained adapter onto a llama.cpp model


@pytest.fixture(scope="module")
def adapter_lab(tmp_path_factory, hand_runs):
    """hand_runs' PEFT adapters (q_proj, v_proj of the tiny HF Llama: hidden 64, 2 layers, as the tiny GGUF) and a llama.cpp model."""
    llama_server_or_skip()
    models = tiny_models(tmp_path_factory.mktemp("gguf"))
    runs = tmp_path_factory.mktemp("runs")
    shutil.copytree(hand_runs / "exp1" / "checkpoint-4", runs / "exp-nobase" / "checkpoint-4")
    config = runs / "exp-nobase" / "checkpoint-4" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": "/nowhere/base"}))
    age(runs / "exp-nobase" / "checkpoint-4", HOUR_S)
    lab = {
        "lab": "gguf-adapter-lab",
        "machines": [{"name": "box", "gpus": "none"}],
        "models": [
            {
                "name": "tiny-gguf",
                "path": str(models["a"]),
                "engine": "llamacpp",
                "machine": "box",
                "load_timeout_s": "60s",
                "args": ["-c", "256", "-t", "1"],
            }
        ],
        "checkpoints": {
            "dirs": [{"machine": "box", "path": str(hand_runs)}, {"machine": "box", "path": str(runs)}],
            "poll_s": 1,
            "settle_s": 600,
        },
    }
    source = tmp_path_factory.mktemp("adaptersrc") / "lab.yaml"
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path_factory.mktemp("adapter"), source=source) as demo:
        yield demo


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_trained_adapter_is_converted_to_gguf_and_served_on_llama_server(adapter_lab):
    async with FleetClient(load_lab(adapter_lab.lab_path)) as client:
        await client.wait_connected(20)

        async def discovered() -> bool:
            return {"exp1", "exp-nobase"} <= {r["run"] for r in await client.call("box", "checkpoints.runs")}

        await wait_for(discovered, 60, interval=0.5)
        # no base config to convert against: refused, with what can serve it
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "checkpoints.serve", {"run": "exp-nobase", "step": 4, "model": "tiny-gguf"})
        assert (
            exc.value.code == ErrorCode.UNAVAILABLE and "/nowhere/base" in exc.value.message and "vllm model" in exc.value.message
        )
        # converted with llama.cpp's convert_lora_to_gguf.py, started with --lora, applied once warm
        served = await client.call("box", "checkpoints.serve", {"run": "exp1", "step": 4, "model": "tiny-gguf"})
        assert served["mode"] == "gguf-adapter" and served["state"] == "converting" and served["adapter_gguf"].endswith(".gguf")

        async def added() -> bool:  # after the conversion (a child process importing torch)
            return served["model"] in {m["name"] for m in (await client.call("box", "models.list"))["models"]}

        await wait_for(added, 150, interval=0.5)
        model = await settle(client, served["model"], ("warm", "failed"), timeout=90)
        assert model["state"] == "warm", model["error"]
        base = model["endpoint"].removesuffix("/v1")
        adapters = json.loads((await asyncio.to_thread(http, base + "/lora-adapters"))[1])
        assert [(Path(a["path"]).name, a["scale"]) for a in adapters] == [(Path(served["adapter_gguf"]).name, 1.0)]
        status, answer = await asyncio.to_thread(
            post, model["endpoint"], "/v1/completions", {"model": served["model"], "prompt": "Hello", "max_tokens": 4}
        )
        assert status == 200 and answer["usage"]["completion_tokens"] == 4
        await client.call("box", "models.cold", {"model": served["model"]}, timeout=30)
