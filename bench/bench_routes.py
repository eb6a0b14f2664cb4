"""What the gateway's newer routes cost against chat, same run, same instant sim engine: per route, the latency of a
call (p50, p99) and the gateway agent's CPU per 1,000 generated tokens (streamed and not), so the mapping of the
Responses and Messages APIs onto chat is measured, not assumed. Run: .venv/bin/python bench/bench_routes.py [calls]"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from bench.common import percentile
from console.lab.client import FleetClient

TOKENS = 64
LAB = """
lab: bench-routes
machines:
  - {name: hub, gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}, {name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}}
models:
  - {name: instant, path: m/instant, engine: sim, machine: hub, gpus: [0], vram_gib: 1,
     sim: {load_s: 0, warmup_s: 0, wake_s: 0, tokens_per_s: 0, placeholder_mib: 1}}
  - {name: vectors, path: m/vectors, engine: sim, machine: hub, gpus: [1], vram_gib: 1, serves: embedding,
     sim: {load_s: 0, warmup_s: 0, wake_s: 0, tokens_per_s: 0, placeholder_mib: 1}}
orchestra: {warm: [instant, vectors]}
gateway: {machine: hub}
"""
USER = [{"role": "user", "content": "hello there"}]
CASES = {
    "chat": ("/v1/chat/completions", {"model": "instant", "messages": USER, "max_tokens": TOKENS}),
    "responses": ("/v1/responses", {"model": "instant", "input": "hello there", "max_output_tokens": TOKENS}),
    "messages": ("/v1/messages", {"model": "instant", "messages": USER, "max_tokens": TOKENS}),
    "embeddings": ("/v1/embeddings", {"model": "vectors", "input": ["hello there"] * 8}),
}


async def one(session: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> float:
    started = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        async for _ in r.content.iter_any():
            pass
    return time.perf_counter() - started


async def bench(demo: DemoLab, calls: int) -> None:
    lab = load_lab(demo.lab_path)
    assert lab.gateway is not None
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(20)
        while not all(m["state"] == "warm" for m in (await client.call("hub", "models.list"))["models"]):
            await asyncio.sleep(0.2)
    base = lab.gateway.url.removesuffix("/v1")
    key = (demo.dir / "console" / "gateway.key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    agent = psutil.Process(demo.processes[0].pid)
    print(f"{calls} calls a case, {TOKENS} tokens each (embeddings: 8 inputs a call)")
    async with aiohttp.ClientSession() as session:
        for name, (path, body) in CASES.items():
            for stream in (False, True):
                if stream and name == "embeddings":
                    continue
                sent = {**body, "stream": stream} if stream else body
                for _ in range(20):  # warm the path
                    await one(session, base + path, sent, headers)
                cpu = sum(agent.cpu_times()[:2])
                times = [await one(session, base + path, sent, headers) for _ in range(calls)]
                used = sum(agent.cpu_times()[:2]) - cpu
                per_k = used / (calls * TOKENS) * 1000 if name != "embeddings" else used / calls * 1000
                unit = "s CPU / 1,000 tokens" if name != "embeddings" else "ms CPU / call"
                print(
                    f"{name + (' stream' if stream else ''):18} p50 {percentile(times, 50) * 1e3:6.2f} ms  "
                    f"p99 {percentile(times, 99) * 1e3:6.2f} ms  gateway agent {per_k:.4f} {unit}"
                )


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "lab.yaml"
        source.write_text(LAB)
        with DemoLab(Path(tmp) / "demo", source=source) as demo:
            asyncio.run(bench(demo, calls))


if __name__ == "__main__":
    main()
