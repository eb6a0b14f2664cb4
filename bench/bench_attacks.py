"""Attacks on one agent (issue 11: findings 5, 6, 7; issue 21: N1, N3, N6, N8, N10; issue 30: R1, R2, R3, R5, R6, R7, R8, R9, R10,
R12, C4 (names by type); issue 29: L1, L2; issue 31: K1, K2, T1, E1, E2, E3) and what a legitimate console
and a legitimate gateway client see meanwhile, same run.

For each attack: a console's ping p50/p99 and its largest gap between ticks, and a gateway client's latency p50/p99
(one tiny completion every 100 ms from the simulated provider), without the attack and during it, and the agent's
open fds and RSS before and after (and 30 s after with --settle). The agent serves the lab gateway and runs with a
1,024-fd limit (systemd's default). Loopback only. Run: .venv/bin/python bench/bench_attacks.py [seconds] [--only N3,...]

Adding an attack: write one async function (demo, viewer key, seconds, results) in the bench/attacks_*.py module of its
issue (a new module of that name is loaded too) and register it with `@probe("ID what it does")` from bench/probes.py;
a key or other setup the bench's console must issue first is a `@before` function there. This file is the harness:
the lab, the agent, the legitimate console and gateway client, the windows and the report; it names no attack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key
from agents.shell.demo import gateway as gateway_demo
from agents.shell.demo.lab import DemoLab
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.model import load_lab
from bench.attacks_floods import GATEWAY_MODEL
from bench.attacks_quota import gateway_url_and_key
from bench.common import percentile
from bench.probes import probes, setups
from console.lab.client import FleetClient

FD_LIMIT = 1024
LAB = """
lab: attacks
machines:
  - name: box
    gpus: {sim: [{name: "Tesla P4", memory_gib: 8, tdp_w: 75}, {name: "Tesla P4", memory_gib: 8, tdp_w: 75}]}
gateway: {machine: box}
providers:
  - {name: cloud, base_url: "http://127.0.0.1:1/v1", simulated: true, monthly_budget: 1000,
     models: [{name: cloud-small, prompt_per_million: 3.5, completion_per_million: 3.5},
              {name: cloud-large, prompt_per_million: 3.5, completion_per_million: 3.5}]}
models:
  - {name: local-sim, path: models/local-sim, engine: sim, machine: box, gpus: [1], vram_gib: 1}
  - {name: r3-sim, path: models/r3, engine: sim, machine: box, gpus: [0], vram_gib: 1,
     sim: {load_s: 0.1, cold_factor: 1, warmup_s: 0.1, tokens_per_s: 0, placeholder_mib: 1}}
orchestra: {warm: [local-sim]}
alerts: {temp_for_s: 0, clear_for_s: 0}
notify:
  retry_first: 1h
  retry_max: 1h
  routes:  # an endpoint that refuses every notification about GPU 0 and takes the others (R12)
    - {name: pager, kind: command, argv: [/bin/sh, -c, 'if grep -q "gpu.: 0,"; then exit 1; fi']}
"""
ATTACKING = "attacking"  # the attacker's first line: its interpreter is up and the attack begins
PROBES = probes()  # every bench/attacks_*.py module's, by name, in the order they run


def launch_agent(demo: DemoLab) -> subprocess.Popen:
    """The demo's agent for `box` as a real process with systemd's default fd limit; its log in DIR/agent.log."""

    def limit_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    with open(demo.dir / "agent.log", "ab") as log:
        return subprocess.Popen(
            agent_argv(python_agent(sys.executable), demo.lab_path, "box", demo.dir / "agents" / "box", log_level="warning"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            preexec_fn=limit_fds,
        )


def launch_stand_ins(demo: DemoLab) -> list[subprocess.Popen]:
    """The lab's simulated provider (the demo's stand-in), for the gateway's client to ask."""
    procs = []
    for argv in gateway_demo.stand_in_argvs(demo.dir, yaml.safe_load(demo.lab_path.read_text())):
        with open(demo.dir / "stand-in.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [*argv, "--parent-pid", str(os.getpid())],
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
    return procs


def add_viewer(demo: DemoLab, where: Path) -> Path:
    """A viewer key for the attacker, authorized on the agent (re-read live)."""
    key = ensure_key(where / "viewer_key", comment="mallory")
    with (demo.dir / "agents" / "box" / AUTHORIZED_KEYS_NAME).open("a") as f:
        f.write(f"viewer {key.export_public_key().decode().strip()}\n")
    return where / "viewer_key"


@dataclass
class Window:
    """What the legitimate console saw over one window."""

    pings_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    tick_times: list[float] = field(default_factory=list)
    seconds: float = 0.0
    gateway_ms: list[float] = field(default_factory=list)
    gateway_failures: list[str] = field(default_factory=list)
    logins_ms: list[float] = field(default_factory=list)  # fresh console logins (only where the attack is at the door)
    login_failures: list[str] = field(default_factory=list)

    def max_gap_s(self) -> float:
        times = self.tick_times
        return max((b - a for a, b in zip(times, times[1:])), default=float("inf"))

    def line(self) -> str:
        return (
            f"ping p50 {percentile(self.pings_ms, 50):6.1f} ms  p99 {percentile(self.pings_ms, 99):7.1f} ms  "
            f"({len(self.pings_ms)} answered, {len(self.failures)} failed)  ticks {len(self.tick_times):3d} "
            f"in {self.seconds:.0f} s, largest gap {self.max_gap_s():.2f} s; gateway p50 {percentile(self.gateway_ms, 50):6.1f} ms "
            f"p99 {percentile(self.gateway_ms, 99):7.1f} ms ({len(self.gateway_ms)} answered, {len(self.gateway_failures)} failed)"
            + (
                f"; new logins {len(self.logins_ms)} ok, {len(self.login_failures)} failed, p99 {percentile(self.logins_ms, 99):.0f} ms"
                if self.logins_ms or self.login_failures
                else ""
            )
        )


class Console:
    """A legitimate operator console: pings every 50 ms and counts its ticks."""

    def __init__(self, demo: DemoLab):
        self.demo = demo
        self._ticks: list[float] = []
        self.client = FleetClient(load_lab(demo.lab_path), on_event=self._on_event, reconnect=False)

    def _on_event(self, machine: str, event: str, data) -> None:
        if event == "tick":
            self._ticks.append(time.monotonic())

    async def start(self) -> None:
        await self.client.start()
        await self.client.wait_connected(30)

    async def _gateway(self, window: Window, end: float) -> None:
        """A legitimate gateway client: one tiny completion every 100 ms, its latency (none in a lab without a gateway)."""
        if load_lab(self.demo.lab_path).gateway is None:
            return
        url, key = gateway_url_and_key(self.demo)
        payload = {"model": GATEWAY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < end:
                started = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
                    ) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"HTTP {r.status}")
                    window.gateway_ms.append((time.perf_counter() - started) * 1000)
                except Exception as exc:
                    window.gateway_failures.append(str(exc) or type(exc).__name__)
                await asyncio.sleep(0.1)

    async def _logins(self, window: Window, end: float) -> None:
        """A console logging in afresh every 200 ms (connect, hello, ping, leave)."""
        while time.monotonic() < end:
            started = time.perf_counter()
            client = FleetClient(load_lab(self.demo.lab_path), subscribe=[], reconnect=False)
            try:
                await client.start()
                await client.wait_connected(10)
                await client.call("box", "ping", timeout=10)
                window.logins_ms.append((time.perf_counter() - started) * 1000)
            except Exception as exc:
                window.login_failures.append(str(exc) or type(exc).__name__)
            finally:
                await client.stop()
            await asyncio.sleep(0.2)

    async def window(self, seconds: float, logins: bool = False) -> Window:
        window = Window(seconds=seconds)
        first_tick = len(self._ticks)
        end = time.monotonic() + seconds
        gateway = asyncio.create_task(self._gateway(window, end))
        login_task = asyncio.create_task(self._logins(window, end)) if logins else None
        while time.monotonic() < end:
            started = time.perf_counter()
            try:
                await self.client.call("box", "ping", timeout=10)
                window.pings_ms.append((time.perf_counter() - started) * 1000)
            except Exception as exc:
                window.failures.append(str(exc))
            await asyncio.sleep(0.05)
        await gateway
        if login_task is not None:
            await login_task
        window.tick_times = self._ticks[first_tick:]
        return window

    async def stop(self) -> None:
        await self.client.stop()


async def run_attack(demo: DemoLab, viewer: Path, name: str, seconds: float, begun: asyncio.Event | None = None) -> dict:
    """One attack in its own process (its client-side work must not slow the console we measure); its results.

    `begun` is set once the attacker's interpreter is up and its attack begins (or once it ended without)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--attack",
            name,
            "--lab",
            str(demo.lab_path),
            "--key",
            str(viewer),
            "--seconds",
            str(seconds),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        errors = asyncio.ensure_future(proc.stderr.read())  # read all along: a full pipe would stop the attacker
        await proc.stdout.readline()  # the attacker's ATTACKING line
    finally:
        if begun is not None:
            begun.set()
    out = await proc.stdout.read()
    err = await errors
    await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"attack {name!r} failed: {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def measure(
    demo: DemoLab, agent_pid: int, console: Console, viewer: Path, name: str, seconds: float, settle_s: float = 0.0
) -> dict:
    """One attack: the console's window without it, then with it; the agent's fds and RSS around it (and `settle_s` after)."""
    proc = psutil.Process(agent_pid)
    for setup in setups():
        await setup(demo, console.client)
    logins = PROBES[name].logins  # attacks at the login door: fresh logins measured too
    quiet = await console.window(seconds, logins)
    fds0, rss0 = proc.num_fds(), proc.memory_info().rss
    begun = asyncio.Event()
    attack = asyncio.create_task(run_attack(demo, viewer, name, seconds, begun))
    await begun.wait()  # the attacker's interpreter is up: the window and the attack start together
    during = await console.window(seconds, logins)
    results = await attack
    fds1, rss1 = proc.num_fds(), proc.memory_info().rss
    figures = {
        "name": name,
        "quiet": quiet,
        "during": during,
        "fds": (fds0, fds1),
        "rss_mb": (rss0 / 2**20, rss1 / 2**20),
        **results,
    }
    if settle_s:
        await asyncio.sleep(settle_s)
        figures["settled"] = {"after_s": settle_s, "fds": proc.num_fds(), "rss_mb": round(proc.memory_info().rss / 2**20, 1)}
    return figures


async def attack_main(name: str, lab_path: Path, key: Path, seconds: float) -> None:
    """The attacker's process: run one attack, print its results as one JSON line."""
    results: dict = {}
    print(ATTACKING, flush=True)
    await PROBES[name].run(DemoLab(lab_path.parent, source=lab_path), key, seconds, results)
    print(json.dumps(results))


def report(figures: dict) -> str:
    extra = {k: v for k, v in figures.items() if k not in ("name", "quiet", "during", "fds", "rss_mb")}
    return (
        f"{figures['name']}\n  without: {figures['quiet'].line()}\n  during:  {figures['during'].line()}\n"
        f"  agent fds {figures['fds'][0]} -> {figures['fds'][1]} (limit {FD_LIMIT}), "
        f"RSS {figures['rss_mb'][0]:.0f} -> {figures['rss_mb'][1]:.0f} MB; {extra}"
    )


async def main(seconds: float, only: list[str] | None = None, settle_s: float = 0.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src.yaml"
        source.write_text(LAB)
        demo = DemoLab(Path(tmp) / "demo", source=source)
        demo.prepare()
        viewer = add_viewer(demo, Path(tmp))
        agent = launch_agent(demo)
        demo.processes.append(agent)  # for wait_listening's check that it is alive
        stand_ins = launch_stand_ins(demo)
        try:
            demo.wait_listening()
            console = Console(demo)
            await console.start()
            print(f"agent pid {agent.pid}, {os.cpu_count()} CPUs, {seconds:.0f} s windows")
            for name in PROBES:
                if only and not any(name.startswith(prefix) for prefix in only):
                    continue
                print(report(await measure(demo, agent.pid, console, viewer, name, seconds, settle_s)), flush=True)
            await console.stop()
        finally:
            agent.terminate()
            agent.wait(timeout=30)
            for proc in stand_ins:
                proc.terminate()
                proc.wait(timeout=10)
            print(f"agent log: {(demo.dir / 'agent.log').stat().st_size} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", nargs="?", type=float, default=10.0, help="each window (default 10)")
    parser.add_argument("--only", help="attacks whose names start with these, comma-separated (e.g. N1,N3)")
    parser.add_argument("--settle", type=float, default=0.0, help="also read fds and RSS this many seconds after each attack")
    parser.add_argument("--attack", choices=list(PROBES), help=argparse.SUPPRESS)
    parser.add_argument("--lab", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, dest="attack_seconds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        asyncio.run(attack_main(args.attack, args.lab, args.key, args.attack_seconds))
    else:
        asyncio.run(main(args.seconds, args.only.split(",") if args.only else None, args.settle))
