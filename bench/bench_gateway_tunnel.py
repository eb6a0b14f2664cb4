"""The gateway to an engine on another agent, through the SSH tunnel, against calling that engine directly on its
loopback: same run, same sim engines (no delays but the streamer's token rate).

Goals (issue 20): added latency p50 <= 2 ms and p99 <= 10 ms; streaming through the tunnel >= 0.98 of direct;
200 concurrent streams through the tunnel with no errors.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.gateway import GATEWAY_STATUS
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_LIST
from agents.wire.lab.model import load_lab
from agents.wire.protocol import LinkStatus
from bench.bench_gateway import BODY, stream, timed_post
from bench.common import EngineSessions, percentile
from console.lab.client import FleetClient

CALLS = 400
STREAM_TOKENS, STREAM_RATE = 400, 400.0  # one second per stream at the engine's rate
STREAM_RUNS = 5
CONCURRENT = 200
SIM = "{load_s: 0, warmup_s: 0, wake_s: 0, tokens_per_s: %s, placeholder_mib: 1}"
LAB = f"""
lab: bench-gateway-tunnel
machines:
  - {{name: hub, gpus: {{sim: [{{name: "Tesla P4", memory_gib: 8, tdp_w: 75}}]}}}}
  - {{name: node, gpus: {{sim: [{{name: "Tesla P4", memory_gib: 8, tdp_w: 75}}]}}}}
models:
  - {{name: instant, path: m/instant, engine: sim, machine: node, gpus: [0], vram_gib: 1, sim: {SIM % 0}}}
  - {{name: streamer, path: m/streamer, engine: sim, machine: node, gpus: [0], vram_gib: 1, sim: {SIM % STREAM_RATE}}}
  - {{name: crowd, path: m/crowd, engine: sim, machine: node, gpus: [0], vram_gib: 1, sim: {SIM % 0}}}
orchestra: {{warm: [instant, streamer, crowd]}}
gateway: {{machine: hub, policies: {{queue_size: 1000, idle_ttl_s: 3600}}}}
"""


async def paced(session: aiohttp.ClientSession, url: str, tokens: int, headers: dict | None = None) -> tuple[float, float]:
    """(events per second from the first event to the last, seconds to the first): the pace the client sees."""
    started = time.perf_counter()
    times = []
    payload = {"model": "streamer", "messages": [{"role": "user", "content": "go"}], "max_tokens": tokens, "stream": True}
    async with session.post(url, json=payload, headers=headers) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if line.startswith(b"data: ") and b"[DONE]" not in line:
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0]), times[0] - started


async def bench(demo: DemoLab) -> None:
    lab = load_lab(demo.lab_path)
    assert lab.gateway is not None, "the bench's lab has a gateway"
    gateway = f"http://127.0.0.1:{lab.gateway.port}/v1"
    auth = {"Authorization": f"Bearer {(demo.dir / 'console' / 'gateway.key').read_text().strip()}"}
    async with (
        FleetClient(lab, subscribe=[]) as client,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        await client.wait_connected(30)
        for _ in range(600):
            found = {m.name: m for m in (await request(client, "node", MODELS_LIST)).models}
            section = (await request(client, "hub", GATEWAY_STATUS)).root
            peers = section.peers if section is not None else {}
            if all(found[n].state == "warm" for n in ("instant", "streamer", "crowd")) and peers.get("node") == LinkStatus.ONLINE:
                break
            await asyncio.sleep(0.2)
        engines = EngineSessions()
        direct = {name: engines(m.endpoint) for name, m in found.items() if m.endpoint}

        # 1. added latency, interleaved so both see the same machine
        for _ in range(20):  # warm both paths (the tunnel's channel is opened on the first request)
            await timed_post(direct["instant"][0], f"{direct['instant'][1]}/chat/completions", {**BODY, "model": "instant"})
            await timed_post(session, f"{gateway}/chat/completions", {**BODY, "model": "instant"}, auth)
        d, g = [], []
        for _ in range(CALLS):
            d.append(
                await timed_post(direct["instant"][0], f"{direct['instant'][1]}/chat/completions", {**BODY, "model": "instant"})
            )
            g.append(await timed_post(session, f"{gateway}/chat/completions", {**BODY, "model": "instant"}, auth))
        added50 = (percentile(g, 50) - percentile(d, 50)) * 1000
        added99 = (percentile(g, 99) - percentile(d, 99)) * 1000
        print(
            f"latency, {CALLS} sequential requests to an engine on another agent: direct (its loopback) p50 "
            f"{percentile(d, 50) * 1000:.2f} ms p99 {percentile(d, 99) * 1000:.2f} ms; through the gateway and the SSH tunnel "
            f"p50 {percentile(g, 50) * 1000:.2f} ms p99 {percentile(g, 99) * 1000:.2f} ms (load {os.getloadavg()[0]:.1f})"
        )
        print(
            f"  added p50 {added50:.2f} ms (goal <= 2) {'OK' if added50 <= 2 else 'MISSED'}; "
            f"added p99 {added99:.2f} ms (goal <= 10) {'OK' if added99 <= 10 else 'MISSED'}"
        )

        # 2. streaming pace (events per second, first to last) and time to the first event, alternating
        rates_d, rates_g, first_d, first_g = [], [], [], []
        for _ in range(STREAM_RUNS):
            rate, first = await paced(direct["streamer"][0], f"{direct['streamer'][1]}/chat/completions", STREAM_TOKENS)
            rates_d.append(rate)
            first_d.append(first)
            rate, first = await paced(session, f"{gateway}/chat/completions", STREAM_TOKENS, auth)
            rates_g.append(rate)
            first_g.append(first)
        ratio = sum(rates_g) / sum(rates_d)
        print(
            f"streaming {STREAM_TOKENS} tokens at {STREAM_RATE:.0f}/s, {STREAM_RUNS} runs each: pace direct {sum(rates_d) / STREAM_RUNS:.1f} "
            f"events/s, through the tunnel {sum(rates_g) / STREAM_RUNS:.1f} events/s: ratio {ratio:.3f} (goal >= 0.98) "
            f"{'OK' if ratio >= 0.98 else 'MISSED'}; first event p50 {percentile(first_d, 50) * 1000:.1f} ms direct, "
            f"{percentile(first_g, 50) * 1000:.1f} ms through the tunnel"
        )

        # 3. 200 concurrent streams, direct then through the gateway and the tunnel
        async def crowd(via: aiohttp.ClientSession, url: str, headers: dict | None) -> tuple[list[float], int]:
            results = await asyncio.gather(
                *(stream(via, url, "crowd", 16, headers) for _ in range(CONCURRENT)), return_exceptions=True
            )
            errors = sum(isinstance(r, BaseException) for r in results)
            return [r[0] for r in results if not isinstance(r, BaseException)], errors

        crowd_d, errors_d = await crowd(direct["crowd"][0], f"{direct['crowd'][1]}/chat/completions", None)
        crowd_g, errors_g = await crowd(session, f"{gateway}/chat/completions", auth)
        print(
            f"{CONCURRENT} concurrent streams: errors direct {errors_d}, through the tunnel {errors_g} "
            f"{'OK' if errors_g == 0 else 'MISSED'}; p50 direct {percentile(crowd_d, 50) * 1000:.1f} ms, through the tunnel "
            f"{percentile(crowd_g, 50) * 1000:.1f} ms"
        )

        await engines.close()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cetlab-bench-tunnel-") as tmp:
        source = Path(tmp) / "src" / "lab.yaml"
        source.parent.mkdir()
        source.write_text(LAB)
        with DemoLab(Path(tmp) / "run", source=source) as demo:
            asyncio.run(bench(demo))


if __name__ == "__main__":
    main()
