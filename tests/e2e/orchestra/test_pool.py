"""The model pool end to end: real agents over SSH, real sim-engine processes, real page cache."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from agents.orchestra.engines import engine_spec
from agents.shell.demo.lab import DemoLab
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import load_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.pool import engine_http, pool_lab, post, settle, sim_model
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


def metric(endpoint: str, name: str) -> float:
    text = engine_http(endpoint.removesuffix("/v1") + "/metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def gpu_used(status: dict, index: int) -> int:
    return next(g["mem_used_bytes"] for g in status["gpus"] if g["index"] == index)


# ---------------------------------------------------------------------------- the sim engine over SSH


async def test_sim_engine_every_state_sleep_wake_crash_and_bad_input(run_pool):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    demo = run_pool(
        pool_lab(
            [
                sim_model("a", [0], 18),
                sim_model("b", [0], 18),
                sim_model("crashy", [1], 4, fail_after_s=1.5),
                {"name": "nowhere", "path": "models/none", "engine": "sim", "machine": "box", "gpus": [1], "vram_gib": 1},
                {"name": "big", "path": "models/a", "engine": "vllm", "machine": "box", "gpus": [1], "vram_gib": 4},
                {**sim_model("clash", [1], 1), "port": taken.getsockname()[1]},  # its engine cannot bind: fails to start
            ]
        )
    )
    lab = load_lab(demo.lab_path)
    async with FleetClient(lab) as client:
        await client.wait_connected(10)
        listed = await client.call("box", "models.list")
        assert {m["name"]: m["state"] for m in listed["models"]}["a"] == "cold"  # placeholder written, then evicted

        started = await client.call("box", "models.warm", {"model": "a"})
        assert started["state"] == "loading"  # answers at once; the state moves on
        a = await settle(client, "a", ("warm",))
        assert a["load_s"] > 0 and a["warmup_s"] >= 0.3 and a["simulated"] is True
        assert a["cached_fraction"] >= 0.9  # warming pre-read the weights into RAM
        assert a["load_phases"]["weights_s"] >= 0.2

        # a real request through the engine's endpoint; its counters count what was served
        before = metric(a["endpoint"], "vllm:generation_tokens_total")
        status, answer = post(a["endpoint"], "/v1/completions", {"model": "a", "prompt": "Capital of France:", "max_tokens": 5})
        assert status == 200 and answer["usage"]["completion_tokens"] == 5 and answer["choices"][0]["text"].strip()
        assert metric(a["endpoint"], "vllm:generation_tokens_total") == before + 5

        # the GPU shows the model (the simulated backend follows the claim) from the next tick on
        async def gpu_shows_a() -> bool:
            return gpu_used(await client.call("box", "status"), 0) >= 18 * 1024**3

        await wait_for(gpu_shows_a)

        # b does not fit next to a: CONFLICT saying how much is missing
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.warm", {"model": "b"})
        assert exc.value.code == ErrorCode.CONFLICT and "missing" in exc.value.message and "swap a b" in exc.value.message

        # sleep: GPU freed; a request queues at the engine (vLLM's contract: no 503), answered after the wake
        await client.call("box", "models.sleep", {"model": "a"})
        a = await settle(client, "a", ("sleeping",))
        queued = asyncio.ensure_future(
            asyncio.to_thread(post, a["endpoint"], "/v1/completions", {"model": "a", "prompt": "hi", "max_tokens": 2})
        )
        await wait_for(lambda: metric(a["endpoint"], "vllm:num_requests_waiting") == 1, timeout=10)
        assert not queued.done()

        async def gpu_freed() -> bool:  # the next tick shows the freed memory
            return gpu_used(await client.call("box", "status"), 0) < 4 * 1024**3

        await wait_for(gpu_freed)
        await client.call("box", "models.warm", {"model": "a"})
        a = await settle(client, "a", ("warm",))
        assert a["wake_s"] is not None and a["wake_s"] >= 0.1
        assert (await queued)[0] == 200
        assert post(a["endpoint"], "/v1/completions", {"model": "a", "prompt": "again", "max_tokens": 2})[0] == 200

        # a LoRA adapter loads into the warm engine (vLLM's runtime endpoint; the sim speaks it too)
        adapter = Path(demo.lab_path).parent / "adapters" / "capitals"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        assert (await client.call("box", "models.adapter", {"model": "a", "name": "capitals", "path": "adapters/capitals"}))[
            "adapter"
        ] == "capitals"
        models = json.loads(engine_http(a["endpoint"].removesuffix("/v1") + "/v1/models")[1])
        assert "capitals" in [m["id"] for m in models["data"]]
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.adapter", {"model": "a", "name": "x", "path": "adapters"})
        assert exc.value.code == ErrorCode.NOT_FOUND and "adapter_config.json" in exc.value.message

        # bad input: typed errors a user can act on, and the agent keeps serving
        for params, code, words in [
            ({"model": "ghost"}, ErrorCode.NOT_FOUND, "no model named 'ghost'"),
            ({"model": "nowhere"}, ErrorCode.MODEL_FILE_MISSING, "does not exist: `mkdir -p"),
            (
                {"model": "big"},
                ErrorCode.UNAVAILABLE,
                "box GPU 1 is a Tesla P4 (sm_61, SIM); vLLM 0.33 needs compute capability 7.0",
            ),
            ({"model": "a", "extra": 1}, ErrorCode.INVALID_PARAMS, "extra"),
        ]:
            with pytest.raises(RemoteError) as exc:
                await client.call("box", "models.warm", params)
            assert exc.value.code == code and words in exc.value.message, exc.value

        # a crash: failed, with the exit code, the log tail and the OOM recognised; a keeps serving
        await client.call("box", "models.warm", {"model": "crashy"})
        crashy = await settle(client, "crashy", ("failed",), timeout=30)
        assert crashy["error"]["exit_code"] == 1 and crashy["error"]["oom"] is True
        assert any("CUDA out of memory" in line for line in crashy["error"]["log_tail"])
        assert any(h["event"] == "fail" for h in crashy["history"])
        assert (await client.call("box", "models.get", {"model": "a"}))["state"] == "warm"
        assert post(a["endpoint"], "/v1/completions", {"model": "a", "prompt": "still here", "max_tokens": 2})[0] == 200
        crashy = await client.call("box", "models.cold", {"model": "crashy"})
        assert crashy["state"] in ("cold", "cached") and crashy["error"] is None

        # an engine that fails to start: failed with its own words, nothing else disturbed
        await client.call("box", "models.warm", {"model": "clash"})
        clash = await settle(client, "clash", ("failed",))
        assert "exited with code 1" in clash["error"]["message"] and clash["error"]["exit_code"] == 1
        assert clash["error"]["oom"] is False
        assert any("Address already in use" in line for line in clash["error"]["log_tail"])
        assert (await client.call("box", "models.get", {"model": "a"}))["state"] == "warm"
        taken.close()

        # every transition is timed and kept in SQLite
        history = (await client.call("box", "models.get", {"model": "a"}))["history"]
        events = {h["event"] for h in history}
        assert {"load", "warmup", "sleep", "wake", "state"} <= events
        transitions = [(h["from_state"], h["to_state"]) for h in history if h["event"] == "state"]
        assert ("sleeping", "loading") in transitions and ("warming", "warm") in transitions

        a = await client.call("box", "models.cold", {"model": "a"})
        assert a["state"] == "cached" and a["endpoint"] is None  # stopped, weights still in RAM

        # cold while loading cancels the load and stops the half-started engine
        assert (await client.call("box", "models.warm", {"model": "b"}))["state"] == "loading"
        b = await client.call("box", "models.cold", {"model": "b"})
        assert b["state"] in ("cold", "cached") and b["endpoint"] is None and b["op"] is None
        assert (await client.call("box", "models.warm", {"model": "b"}))["state"] == "loading"
        endpoint = (await settle(client, "b", ("warm",)))["endpoint"]

        # an engine killed by a signal: the signal is named (not "exited with code -9")
        port = EngineAddress.parse(endpoint).socket
        [server] = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "agents.orchestra.engines.vllm.twin" in (p.info["cmdline"] or []) and port in (p.info["cmdline"] or [])
        ]
        server.send_signal(signal.SIGKILL)
        killed = await settle(client, "b", ("failed",))
        assert killed["error"]["message"] == "the engine was killed by SIGKILL", killed["error"]


async def test_the_rotation_plan_runs_by_itself_on_its_timer(run_pool):
    demo = run_pool(
        pool_lab(
            [sim_model("a", [0], 18), sim_model("b", [0], 18)],
            orchestra={"warm": ["a"], "rotate_every": "2s", "rotation": [["b"], ["a"]]},
        )
    )
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        rotation = await client.call("box", "models.rotation")
        assert rotation["plan"] == [["b"], ["a"]] and rotation["next_at"] is not None

        async def a_rotation_ran() -> dict | None:  # the first one swaps a for b; later ones may have swapped back
            last = (await client.call("box", "models.rotation"))["last"]
            return last if last and last["swaps"] else None

        last = await wait_for(a_rotation_ran, timeout=60)
        assert last["swaps"] in ([["a", "b"]], [["b", "a"]]) and last["not_warm"] == []


async def test_swap_cache_budget_and_rotation_plan(run_pool):
    demo = run_pool(
        pool_lab(
            [sim_model("a", [0], 18), sim_model("b", [0], 18), sim_model("c", [1], 6, placeholder_mib=3)],
            # rotated by hand (`models.rotate`): what the test reads after it stays put however slow the machine is
            orchestra={"warm": ["a"], "rotate_every": "24h", "rotation": [["b"], ["a"]]},
            ram_cache_gib=5 / 1024,  # 5 MiB: room for two of the 2 MiB placeholders, not three
        )
    )
    lab = load_lab(demo.lab_path)
    async with FleetClient(lab) as client:
        await client.wait_connected(10)
        # the start set comes up by itself, then the plan swaps a for b on GPU 0
        await settle(client, "a", ("warm",))
        await client.call("box", "models.rotate")

        async def rotated() -> dict | None:
            r = await client.call("box", "models.rotation")
            return r["last"] if r["last"] and r["last"]["index"] == 0 and not r["running"] else None

        last = await wait_for(rotated, timeout=60)
        assert last["index"] == 0 and last["swaps"] == [["a", "b"]] and last["not_warm"] == []
        b = await client.call("box", "models.get", {"model": "b"})
        assert b["state"] == "warm" and b["gpus"] == [0]
        assert (await client.call("box", "models.get", {"model": "a"}))["state"] == "sleeping"
        rotation = await client.call("box", "models.rotation")
        assert rotation["unavailable_s"] > 0 and 0 < rotation["overhead_pct"] < 100

        # the page cache within the budget: caching c evicts the least recently used
        await client.call("box", "models.cache", {"model": "c"})
        c = await settle(client, "c", ("cached",))
        assert c["cached_fraction"] > 0.95
        fractions = {m["name"]: m["cached_fraction"] for m in (await client.call("box", "models.list"))["models"]}
        assert sum(1 for f in fractions.values() if f and f > 0.5) <= 2, fractions

        # swap by hand: a swap against the plan works, bad ones are refused
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.swap", {"out": "c", "in": "a"})
        assert exc.value.code == ErrorCode.CONFLICT and "not serving" in exc.value.message
        with pytest.raises(RemoteError) as exc:
            await client.call("box", "models.swap", {"out": "a", "in": "b"})
        assert exc.value.code == ErrorCode.CONFLICT and "already warm" in exc.value.message


async def test_the_sim_engine_counts_tokens_as_it_makes_them_and_the_pool_reports_a_windowed_rate(run_pool):
    """vLLM counts each generated token at the step that makes it: the counter rises while a request runs.
    One request at 40 tok/s: the pool's figure over its 10 s window is about 40. The agent stamps a scrape's count when
    the answer arrives, so a loaded machine that answers one scrape late and the next at once reads a few per cent
    over: 10% is allowed (a count made once per choice, or in one lump at the end, is far outside it)."""
    demo = run_pool(pool_lab([sim_model("talky", [1], 4, tokens_per_s=40)], orchestra={"warm": ["talky"]}))
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        talky = await settle(client, "talky", ("warm",))
        assert talky["tokens_per_s_window_s"] == 10.0
        before = metric(talky["endpoint"], "vllm:generation_tokens_total")  # the pool's warm-up request
        request = asyncio.create_task(
            asyncio.to_thread(
                post, talky["endpoint"], "/v1/completions", {"model": "talky", "prompt": "count slowly", "max_tokens": 200}
            )
        )
        await wait_for(lambda: before < metric(talky["endpoint"], "vllm:generation_tokens_total") < before + 200, timeout=30)

        async def rated() -> float | None:
            return (await client.call("box", "models.get", {"model": "talky"}))["tokens_per_s"]

        assert 0 < await wait_for(rated, timeout=30) <= 44.0
        status, answer = await request
        assert status == 200 and answer["usage"]["completion_tokens"] == 200
        assert metric(talky["endpoint"], "vllm:generation_tokens_total") == before + 200
        assert 0 < await rated() <= 44.0
        listed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path), "models"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "TOK/S: generated tokens per second over the last 10 s" in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.parametrize("takes_all", [False, True])
async def test_rotation_takes_out_only_the_models_its_sets_name(run_pool, takes_all):
    """`loose` is in no rotation set (like a model warmed by hand or a served checkpoint): the rotation leaves it up,
    unless lab.yaml says `rotation_takes_all: true`."""
    demo = run_pool(
        pool_lab(
            [sim_model("a", [0], 18), sim_model("b", [0], 18), sim_model("loose", [1], 4)],
            orchestra={"warm": ["a", "loose"], "rotation": [["b"], ["a"]], "rotation_takes_all": takes_all},
        )
    )
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        await settle(client, "a", ("warm",))
        await settle(client, "loose", ("warm",))
        await client.call("box", "models.rotate")

        async def rotated() -> dict | None:
            rotation = await client.call("box", "models.rotation")
            return rotation["last"] if rotation["last"] and not rotation["running"] else None

        last = await wait_for(rotated, timeout=60)
        assert last["index"] == 0 and last["swaps"] == [["a", "b"]] and last["not_warm"] == [] and last["problems"] == []
        loose = await settle(client, "loose", ("warm", "sleeping"))
        if takes_all:
            assert last["out"] == ["loose"] and loose["state"] == "sleeping"
        else:
            assert last["out"] == [] and loose["state"] == "warm"


async def test_cli_models_warm_swap_cold_json(run_pool):
    demo = run_pool(pool_lab([sim_model("a", [0], 18), sim_model("b", [0], 18)]))

    def cli(*args: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path), "--json", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}

    code, data = await asyncio.to_thread(cli, "warm", "a")
    assert code == 0 and data["state"] == "warm" and data["simulated"] is True
    assert set(data) >= {
        "name",
        "machine",
        "engine",
        "state",
        "gpus",
        "vram_bytes",
        "cached_fraction",
        "load_s",
        "warmup_s",
        "wake_s",
        "requests_running",
        "endpoint",
        "simulated",
    }
    code, data = await asyncio.to_thread(cli, "swap", "a", "b")
    assert code == 0 and data["in"]["state"] == "warm" and data["out"]["state"] == "sleeping"
    code, data = await asyncio.to_thread(cli, "models")
    assert code == 0 and {m["name"]: m["state"] for m in data["models"]} == {"a": "sleeping", "b": "warm"}
    code, data = await asyncio.to_thread(cli, "warm", "a")
    assert code == 1 and data["error"]["code"] == "conflict" and "missing" in data["error"]["message"]
    code, data = await asyncio.to_thread(cli, "cold", "b")
    assert code == 0 and data["state"] in ("cold", "cached")
    code, data = await asyncio.to_thread(cli, "warm", "ghost")
    assert code == 1 and data["error"]["code"] == "not_found"


# ---------------------------------------------------------------------------- the bundled demo lab


@pytest.mark.timeout(180)
async def test_demo_lab_pool_states_and_a_swap_over_ssh(tmp_path):
    # Its own demo lab: "cached" is measured page-cache residency, which a long test session
    # (or a busy CI machine) may rightly evict from the shared demo lab's files.
    demo_lab = DemoLab(tmp_path / "demo")
    demo_lab.start()
    demo_lab.wait_listening()
    try:
        await _pool_states_and_a_swap(demo_lab)
    finally:
        demo_lab.stop()


async def _pool_states_and_a_swap(demo_lab: DemoLab) -> None:
    lab = load_lab(demo_lab.lab_path)
    async with FleetClient(lab) as client:
        await client.wait_connected(10)
        # the start-up plan: warm, sleeping, cached and cold models, each on the machine lab.yaml says
        expected = {
            "llama-3.1-8b": "warm",
            "qwen2.5-coder-7b": "warm",
            "mistral-7b-q4": "warm",
            "llama-3.1-70b-4bit": "cached",
            "phi-3-mini": "sleeping",
            "codellama-7b": "cached",
            "llama-3.2-3b": "cold",
            "tiny-llama": "cold",
        }
        machines = {m.name: m.machine for m in lab.models}
        from agents.orchestra import pagecache

        models = {m.name: m for m in lab.models}
        for name, state in expected.items():
            try:
                model = await settle(client, name, (state,), timeout=45, machine=machines[name])
            except AssertionError:
                if state != "cached":
                    raise
                # "cached" is measured residency, which a loaded machine may reclaim after the start plan read the files
                # (CI: llama-3.1-70b-4bit was cold): read them again, and the agent's next measure (5 s) must see them
                pagecache.warm(pagecache.model_files(lab.resolve(models[name].path)))
                model = await settle(client, name, (state,), timeout=45, machine=machines[name])
            assert model["simulated"] is engine_spec(model["engine"]).simulated
        listed = await client.call("m5", "models.list")
        assert listed["rotation"]["plan"] and listed["rotation"]["next_at"] > 0
        assert {m["name"] for m in listed["models"]} == {n for n, machine in machines.items() if machine == "m5"}

        # swap on the demo lab: codellama takes qwen's P40 (llama.cpp: qwen stops, its GGUF stays in RAM), then qwen comes back.
        # "cached" is measured residency: a loaded machine may have reclaimed the file's pages since qwen loaded minutes ago,
        # so the test reads it back first (what the agent is tested on is classifying a stopped model by its residency)
        for name in ("qwen2.5-coder-7b", "codellama-7b"):
            pagecache.warm(pagecache.model_files(lab.resolve(models[name].path)))
        await client.call("m5", "models.swap", {"out": "qwen2.5-coder-7b", "in": "codellama-7b"})
        codellama = await settle(client, "codellama-7b", ("warm",), machine="m5")
        assert codellama["gpus"] == [2] and codellama["cached_fraction"] >= 0.9
        assert (await client.call("m5", "models.get", {"model": "qwen2.5-coder-7b"}))["state"] == "cached"
        with pytest.raises(RemoteError) as exc:
            await client.call("m5", "models.swap", {"out": "llama-3.1-8b", "in": "llama-3.1-70b-4bit"})
        assert exc.value.code == ErrorCode.CONFLICT and "pinned" in exc.value.message
        await client.call("m5", "models.swap", {"out": "codellama-7b", "in": "qwen2.5-coder-7b"})
        qwen = await settle(client, "qwen2.5-coder-7b", ("warm",), machine="m5")
        assert qwen["load_s"] is not None and qwen["swap_s"] is not None
        assert (await client.call("m5", "models.get", {"model": "codellama-7b"}))["state"] == "cached"
