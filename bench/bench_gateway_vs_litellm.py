"""The lab gateway against calling the real llama-server directly and against LiteLLM's proxy, in one run.

One llama-server (the pinned build, `make llama-server`) on 127.0.0.1:PORT serves a random-weight GGUF
(agents.orchestra.engines.llamacpp.tiny_gguf); a one-machine lab's agent (a real process, as a user runs it) starts it and its
gateway serves it; LiteLLM's proxy (from its own venv: LITELLM_VENV or --litellm) is put in front of the same
llama-server. Every figure is a ratio to, or a difference from, the direct figure measured in the same rounds,
alternated direct / cetlab / LiteLLM so all three see the same machine:

1. tokens/s of one chat stream (STREAM_TOKENS tokens), and of 16 concurrent streams (all their tokens over the
   wall time of the batch); ratio to direct. Goals (issue 31 item 7): >= 0.95 single, >= 0.97 at 16 streams.
2. added latency of a short non-streamed chat request (max_tokens 1): p50 through the proxy minus p50 direct.
3. CPU seconds per 1,000 streamed tokens: the gateway's agent process (every thread, the scheduler's account in
   /proc/PID/task/*/schedstat, over the cetlab rounds only; its telemetry runs meanwhile, so this is an upper bound)
   and LiteLLM's proxy process (with its children) over its rounds.

Two engine paces: the default 2-layer GGUF, which llama-server runs at thousands of tokens/s, so the proxy's own
cost shows in full; and a bigger one (--big: 8 layers of 512), paced nearer a real model on a CPU, where the engine,
not the proxy, sets the pace. llama-server gets one thread (-t 1); on a 2-core box the proxy has the other.

LiteLLM cannot share the test venv (bench/litellm_check.py says why):
    python3 -m venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'
    LITELLM_VENV=/tmp/litellm python bench/bench_gateway_vs_litellm.py [--big] [--rounds N]
Without it, the LiteLLM columns are left out with a line saying so.

Measured on 2 shared cores at load 3.5-8.8 (docs/benchmarks.md has every run): the gateway's CPU per 1,000 streamed
tokens 0.114 s before its byte pass-through, 0.096 s after (LiteLLM's proxy 0.89-1.00 s); added p50 per short
request 2.3-4.9 ms (LiteLLM 18-48 ms), mostly waiting for a core; tokens/s 0.68-0.92 of direct for one stream and
0.72-0.98 for 16 (LiteLLM 0.19-0.52 and 0.28-0.43), ratios that move +-0.2 between runs at that load, so the goals
(0.95, 0.97) are not shown met here. A quiet machine (or one with more cores than llama-server's thread) is needed to
tell them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.orchestra.engine import free_port
from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.method import request
from agents.wire.catalogue.models import MODELS_GET, ModelDetail, ModelParams
from agents.wire.lab.model import load_lab
from bench.common import CpuWindow, percentile, this_checkout_first
from console.lab.client import FleetClient

STREAM_TOKENS = 200
CONCURRENT = 16
SHORT_CALLS = 40  # per round
BIG = {"embed": 512, "layers": 8, "ffn": 1408}
SERVER_ARGS = ["-c", str(CONCURRENT * 320), "-np", str(CONCURRENT), "-t", "1"]
MODEL = "tiny"
LITELLM_ENV = "LITELLM_VENV"
LITELLM_KEY = "sk-bench-vs-litellm"  # the proxy refuses to start without a master key


class Failed(Exception):
    """A request answered with an error."""


@dataclass
class Path3:
    """One way to the engine: its URL, headers, and what it measured."""

    name: str
    url: str
    headers: dict[str, str]
    pid: int | None = None  # the proxy's process, for its CPU
    single: list[float] = field(default_factory=list)  # tokens/s per round
    crowd: list[float] = field(default_factory=list)
    short: list[float] = field(default_factory=list)  # seconds per call
    cpu_s: float = 0.0
    tokens: int = 0
    errors: int = 0  # requests that failed (and were sent again)

    def cpu(self) -> CpuWindow | None:
        return CpuWindow(self.pid) if self.pid else None


def chat(tokens: int, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": tokens,
        "stream": stream,
        "temperature": 0,
    }


async def one_stream(session: aiohttp.ClientSession, way: Path3) -> tuple[float, int]:
    for _ in range(3):  # a kept-alive connection the server closed as it was reused: counted, and again
        try:
            return await _one_stream(session, way)
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, Failed):
            way.errors += 1
    raise RuntimeError(f"{way.name}: no stream in 3 tries")


async def _one_stream(session: aiohttp.ClientSession, way: Path3) -> tuple[float, int]:
    """(seconds, tokens) of one stream of STREAM_TOKENS tokens: the tokens its usage says (a proxy may merge events),
    else its content events."""
    started = time.perf_counter()
    events, usage = 0, None
    body = {**chat(STREAM_TOKENS, True), "stream_options": {"include_usage": True}}
    async with session.post(f"{way.url}/chat/completions", json=body, headers=way.headers) as r:
        if r.status != 200:
            raise Failed(f"{way.name}: {r.status} {(await r.text())[:300]}")
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"usage"' in line and b'"completion_tokens"' in line:
                usage = json.loads(line[6:])["usage"]["completion_tokens"]
            elif b'"content":"' in line.replace(b": ", b":"):
                events += 1
    return time.perf_counter() - started, usage if usage is not None else events


async def crowd(session: aiohttp.ClientSession, way: Path3) -> tuple[float, int]:
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(session, way) for _ in range(CONCURRENT)))
    return time.perf_counter() - started, sum(tokens for _, tokens in results)


async def short_call(session: aiohttp.ClientSession, way: Path3) -> float:
    for _ in range(3):  # a kept-alive connection the server closed as it was reused: counted, and again
        started = time.perf_counter()
        try:
            async with session.post(f"{way.url}/chat/completions", json=chat(1, False), headers=way.headers) as r:
                await r.read()
                if r.status != 200:
                    raise Failed(f"{way.name}: {r.status}")
            return time.perf_counter() - started
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, Failed):
            way.errors += 1
    raise RuntimeError(f"{way.name}: no answer in 3 tries")


async def rounds(ways: list[Path3], count: int) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for way in ways:  # warm every path (connections, llama-server's slots)
            await one_stream(session, way)
            await short_call(session, way)
        for n in range(count):
            order = ways if n % 2 == 0 else [ways[0], *reversed(ways[1:])]
            for way in order:
                window = way.cpu()
                seconds, tokens = await one_stream(session, way)
                way.single.append(tokens / seconds)
                seconds, crowd_tokens = await crowd(session, way)
                way.crowd.append(crowd_tokens / seconds)
                if window is not None:
                    way.cpu_s += window.cpu_s() - window.cpu0
                way.tokens += tokens + crowd_tokens
            for _ in range(SHORT_CALLS):
                for way in order:
                    way.short.append(await short_call(session, way))


def report(ways: list[Path3], pace: str) -> None:
    direct = ways[0]
    single_d, crowd_d = statistics.median(direct.single), statistics.median(direct.crowd)
    print(
        f"{pace}: direct {single_d:.0f} tokens/s (1 stream), {crowd_d:.0f} tokens/s ({CONCURRENT} streams); "
        f"short call p50 {percentile(direct.short, 50) * 1000:.2f} ms; {direct.errors} failed requests; load {os.getloadavg()[0]:.1f}"
    )
    for way in ways[1:]:
        # each round's ratio to the direct figure of the same round (the load of a shared box drifts between rounds)
        single = statistics.median(w / d for w, d in zip(way.single, direct.single))
        many = statistics.median(w / d for w, d in zip(way.crowd, direct.crowd))
        added = (percentile(way.short, 50) - percentile(direct.short, 50)) * 1000
        cpu = f"{way.cpu_s / way.tokens * 1000:.3f} CPU s per 1,000 streamed tokens" if way.tokens else "CPU not measured"
        goals = ""
        if way.name == "cetlab":
            goals = (
                f" (goals >= 0.95 single {'OK' if single >= 0.95 else 'MISSED'}, "
                f">= 0.97 at {CONCURRENT} {'OK' if many >= 0.97 else 'MISSED'})"
            )
        print(
            f"  {way.name:8s} single {single:.3f} of direct, {CONCURRENT} streams {many:.3f} of direct{goals}; "
            f"added p50 {added:.2f} ms per short request; {cpu}; {way.errors} failed requests (sent again)"
        )


def start_litellm(venv: Path, folder: Path, engine_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = folder / "litellm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": engine_url, "api_key": "x"}}
                ],
                "litellm_settings": {"drop_params": True, "num_retries": 0},
                "general_settings": {"master_key": LITELLM_KEY},
            }
        )
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    env.pop("PYTHONPATH", None)
    log = (folder / "litellm.log").open("wb")
    proc = subprocess.Popen(
        [
            str(venv / "bin" / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


async def wait_ok(
    url: str, headers: dict[str, str] | None = None, proc: subprocess.Popen[bytes] | None = None, seconds: float = 300
) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                log = Path(str(proc.args[2])).with_name("litellm.log")  # beside its --config
                raise RuntimeError(f"LiteLLM's proxy ended ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                async with session.post(f"{url}/chat/completions", json=chat(1, False), headers=headers) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} gave no answer in {seconds:g} s")


async def bench(
    demo: DemoLab, engine_port: int, litellm: tuple[subprocess.Popen[bytes], str] | None, count: int, pace: str
) -> None:
    lab = load_lab(demo.lab_path)
    assert lab.gateway is not None
    key = (demo.dir / "console" / "gateway.key").read_text().strip()
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(60)
        for _ in range(30000):
            got: ModelDetail = await request(client, "box", MODELS_GET, ModelParams(model=MODEL))
            if got.state == "warm" and not got.op:
                break
            if got.state == "failed":
                raise RuntimeError(f"{MODEL} failed: {got.error}")
            await asyncio.sleep(0.05)
    agent = next(p.pid for p in demo.processes if isinstance(p.args, list) and "box" in p.args)
    direct = Path3("direct", f"http://127.0.0.1:{engine_port}/v1", {})
    ways = [direct, Path3("cetlab", f"http://127.0.0.1:{lab.gateway.port}/v1", {"Authorization": f"Bearer {key}"}, agent)]
    await wait_ok(ways[1].url, ways[1].headers)
    if litellm is not None:
        ways.append(Path3("LiteLLM", f"{litellm[1]}/v1", {"Authorization": f"Bearer {LITELLM_KEY}"}, litellm[0].pid))
        await wait_ok(ways[2].url, ways[2].headers, litellm[0])
    print(
        f"{count} rounds of: 1 stream, {CONCURRENT} streams, {SHORT_CALLS} short calls each way ({', '.join(w.name for w in ways)})",
        flush=True,
    )
    await rounds(ways, count)
    report(ways, pace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--litellm", type=Path, default=os.environ.get(LITELLM_ENV), help=f"LiteLLM's venv (or ${LITELLM_ENV})")
    parser.add_argument("--big", action="store_true", help=f"the bigger GGUF ({BIG}), paced nearer a real model")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    binary, vocab = llamacpp_build.find_llama_server(), llamacpp_build.vocab_file()
    if binary is None or vocab is None:
        print(f"no llama-server: {llamacpp_build.MAKE_HINT}", file=sys.stderr)
        return 1
    this_checkout_first()
    venv: Path | None = args.litellm
    if venv is not None and not (venv / "bin" / "litellm").is_file():
        print(f"no LiteLLM proxy at {venv}/bin/litellm: install it with pip install 'litellm[proxy]'", file=sys.stderr)
        return 1
    if venv is None:
        print(f"LiteLLM left out: give its venv with --litellm or {LITELLM_ENV} (see this file's docstring)")
    with tempfile.TemporaryDirectory(prefix="bench-vs-litellm-") as tmp:
        folder = Path(tmp)
        gguf = folder / "model.gguf"
        shape = BIG if args.big else {}
        write_tiny_gguf(gguf, vocab, **shape)
        pace = f"{'bigger' if args.big else 'tiny'} GGUF ({gguf.stat().st_size / 2**20:.0f} MiB, llama-server -t 1)"
        engine_port = free_port()
        source = folder / "src" / "lab.yaml"
        source.parent.mkdir()
        source.write_text(
            yaml.safe_dump(
                {
                    "lab": "bench-vs-litellm",
                    "machines": [{"name": "box", "gpus": "none"}],
                    "models": [
                        {
                            "name": MODEL,
                            "path": str(gguf),
                            "engine": "llamacpp",
                            "machine": "box",
                            "port": engine_port,
                            "args": SERVER_ARGS,
                        }
                    ],
                    "orchestra": {"warm": [MODEL]},
                    "gateway": {"machine": "box", "policies": {"idle_ttl_s": 36000, "key_concurrency": 64}},
                }
            )
        )
        litellm = start_litellm(venv, folder, f"http://127.0.0.1:{engine_port}/v1") if venv is not None else None
        try:
            with DemoLab(folder / "run", source=source) as demo:
                asyncio.run(bench(demo, engine_port, litellm, args.rounds, pace))
        finally:
            if litellm is not None:
                os.killpg(litellm[0].pid, signal.SIGTERM)
                litellm[0].wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
