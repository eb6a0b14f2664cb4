"""The llama.cpp engine's three figures, one run, the real pinned llama-server (make llama-server) on this machine.

1. Cold start of a GGUF model from the page cache vs from a dropped cache (POSIX_FADV_DONTNEED on the
   file), alternated: llama-server started until its first token (the GGUF is memory-mapped, so the
   weights are read at the first forward pass). Ratio dropped / cached (the field notes claim 14x for RAM caching).
2. Streaming through the lab gateway vs directly to llama-server, alternated: tokens/s ratio. Goal >= 0.98.
3. The control overhead of a llama.cpp swap beyond the engine's own work: the agent's swap time minus
   the out model's stop, the in model's llama-server start-to-listening (its own log) and its warm-up
   request. Goal <= 50 ms (p50).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.orchestra import pagecache
from agents.orchestra.engine import free_port
from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_GET, MODELS_SWAP, ModelDetail, ModelParams, SwapParams
from agents.wire.lab.model import load_lab
from bench.common import EngineSessions, percentile
from console.lab.client import FleetClient

COLD_RUNS = 3
BIG = {"embed": 1024, "layers": 12, "ffn": 2816}  # ~0.8 GB f32: big enough that reading it shows
STREAMS, STREAM_TOKENS = 6, 200
SWAPS = 8
SERVER_ARGS = ["-c", "512", "-t", "1"]  # one core for llama-server, one for the agent and gateway (a 2-core box)


def first_token_s(binary: Path, model: Path) -> float:
    """Start llama-server on ``model``; seconds until its first completion token is back; then stop it."""
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        body = json.dumps({"prompt": "Hello", "max_tokens": 1}).encode()
        deadline = started + 300
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("llama-server gave no token in 300 s")
    finally:
        proc.terminate()
        proc.wait(30)


def bench_cold_start(binary: Path, folder: Path, vocab: Path) -> None:
    model = folder / "big.gguf"
    write_tiny_gguf(model, vocab, embed=BIG["embed"], layers=BIG["layers"], ffn=BIG["ffn"])
    size_gib = model.stat().st_size / 2**30
    cached, dropped = [], []
    for _ in range(COLD_RUNS):
        pagecache.evict([model])
        dropped.append(first_token_s(binary, model))
        pagecache.warm([model])
        cached.append(first_token_s(binary, model))
    c, d = statistics.median(cached), statistics.median(dropped)
    print(
        f"1. cold start of a {size_gib:.2f} GiB GGUF to its first token, median of {COLD_RUNS}: from the page cache {c:.2f} s, "
        f"from a dropped cache {d:.2f} s: ratio {d / c:.1f}x (field notes: ~14x on the lab's disks)"
    )


async def stream(session: aiohttp.ClientSession, url: str, model: str, headers: dict | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    tokens = 0
    payload = {"model": model, "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "stream": True, "ignore_eos": True}
    async with session.post(url, json=payload, headers=headers) as r:
        assert r.status == 200, (r.status, await r.text())
        async for line in r.content:
            if line.startswith(b"data: ") and b"[DONE]" not in line and b'"text":""' not in line.replace(b" ", b""):
                tokens += 1
    return time.perf_counter() - started, tokens


async def bench_gateway_and_swaps(folder: Path, vocab: Path) -> None:
    a, b = folder / "tiny-a.gguf", folder / "tiny-b.gguf"
    write_tiny_gguf(a, vocab, seed=0)
    write_tiny_gguf(b, vocab, seed=1)
    models = [
        {"name": n, "path": str(p), "engine": "llamacpp", "machine": "box", "args": SERVER_ARGS} for n, p in (("a", a), ("b", b))
    ]
    source = folder / "lab.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "lab": "bench-llamacpp",
                "machines": [{"name": "box", "gpus": "none"}],
                "models": models,
                "orchestra": {"warm": ["a"]},
                "gateway": {"machine": "box", "policies": {"idle_ttl_s": 3600}},
            }
        )
    )
    with DemoLab(folder / "demo", source=source) as demo:
        lab = load_lab(demo.lab_path)
        assert lab.gateway is not None
        auth = {"Authorization": f"Bearer {(demo.dir / 'console' / 'gateway.key').read_text().strip()}"}
        async with FleetClient(lab, subscribe=[]) as client, aiohttp.ClientSession() as session:
            await client.wait_connected(30)

            async def state(name: str) -> ModelDetail:
                return await request(client, "box", MODELS_GET, ModelParams(model=name))

            async def settled(name: str, wanted: str) -> ModelDetail:
                for _ in range(6000):
                    got = await state(name)
                    if got.state == wanted and not got.op:
                        return got
                    await asyncio.sleep(0.01)
                raise RuntimeError(f"{name} not {wanted}: {got.state} {got.error}")

            endpoint = (await settled("a", "warm")).endpoint
            assert endpoint is not None
            engines = EngineSessions()
            direct_session, direct = engines(endpoint)
            gateway = f"http://127.0.0.1:{lab.gateway.port}/v1"
            for _ in range(3000):  # the gateway hears of the pool's models by telemetry
                async with session.get(f"{gateway}/models", headers=auth) as r:
                    listed = {m["id"]: m for m in (await r.json()).get("data", [])} if r.status == 200 else {}
                if listed.get("a", {}).get("state") == "warm":
                    break
                await asyncio.sleep(0.01)
            rates_d, rates_g = [], []
            for _ in range(STREAMS):  # alternated, same model, same prompt
                seconds, tokens = await stream(direct_session, f"{direct}/completions", "a")
                rates_d.append(tokens / seconds)
                seconds, tokens = await stream(session, f"{gateway}/completions", "a", auth)
                rates_g.append(tokens / seconds)
            d, g = statistics.median(rates_d), statistics.median(rates_g)
            print(
                f"2. streaming {STREAM_TOKENS} tokens, median of {STREAMS}: direct {d:.0f} tokens/s, through the gateway {g:.0f} tokens/s: "
                f"ratio {g / d:.3f} (goal >= 0.98: {'OK' if g / d >= 0.98 else 'MISSED'})"
            )
            await engines.close()

            control_ms, agent_ms, total_ms = [], [], []
            pair = ("a", "b")
            for _ in range(SWAPS):
                out, incoming = pair
                await request(client, "box", MODELS_SWAP, SwapParams.model_validate({"out": out, "in": incoming}))
                got = await settled(incoming, "warm")
                history = (await state(incoming)).history
                # newest first: this swap's events
                swap = next(h for h in history if h.event == "swap")
                warmup = next(h for h in history if h.event == "warmup")
                stop = next(h for h in (await state(out)).history if h.event == "stop")
                listening = got.load_phases.get("listening_s")
                own = (stop.duration_s or 0.0) + (listening or 0.0) + (warmup.duration_s or 0.0)
                control_ms.append(1000 * ((swap.duration_s or 0.0) - own))
                agent_ms.append(1000 * swap.detail["control_s"])
                total_ms.append(1000 * (swap.duration_s or 0.0))
                pair = (incoming, out)
            print(
                f"3. llama.cpp swap (stop out, start in, warm-up), {SWAPS} swaps: total p50 {percentile(total_ms, 50):.0f} ms; "
                f"beyond llama-server's own stop + start-to-listening + warm-up: p50 {percentile(control_ms, 50):.1f} ms, "
                f"max {max(control_ms):.1f} ms (goal p50 <= 50 ms: {'OK' if percentile(control_ms, 50) <= 50 else 'MISSED'}); "
                f"the agent's own account (beyond the time it waited on the engine): p50 {percentile(agent_ms, 50):.1f} ms"
            )


def main() -> int:
    binary, vocab = llamacpp_build.find_llama_server(), llamacpp_build.vocab_file()
    if binary is None or vocab is None:
        print(f"no llama-server: {llamacpp_build.MAKE_HINT}", file=sys.stderr)
        return 1
    print(f"llama-server: {binary} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-") as tmp:
        folder = Path(tmp)
        bench_cold_start(binary, folder, vocab)
        (folder / "big.gguf").unlink()
        asyncio.run(bench_gateway_and_swaps(folder, vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
