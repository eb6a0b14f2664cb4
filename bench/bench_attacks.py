"""Attacks on one agent (issue 11: findings 5, 6, 7; issue 21: N1, N3, N6, N8, N10; issue 30: R1, R2, R3, R5, R6, R7, R8, R9, R10,
R12, C4 (names by type); issue 29: L1, L2; issue 31: K1, K2, T1, E1, E2, E3) and what a legitimate console
and a legitimate gateway client see meanwhile, same run.

For each attack: a console's ping p50/p99 and its largest gap between ticks, and a gateway client's latency p50/p99
(one tiny completion every 100 ms from the simulated provider), without the attack and during it, and the agent's
open fds and RSS before and after (and 30 s after with --settle). The agent serves the lab gateway and runs with a
1,024-fd limit (systemd's default). Loopback only. Run: .venv/bin/python bench/bench_attacks.py [seconds] [--only N3,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncssh
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key
from agents.runtime.link import read_line
from agents.shell.demo import gateway as gateway_demo
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.gateway import GATEWAY_KEYS_ADD, KeyAddParams
from agents.wire.catalogue.method import request
from agents.wire.lab.model import load_lab
from bench.attacks_classes import c4_hostile_names
from bench.attacks_iv import (
    ATTACKER_GATEWAY_KEY,
    connection_storm,
    gateway_url_and_key,
    issue_quota_keys,
    key_tokens_today,
    open_channel,
    r1_choices,
    r2_lengths,
    r4_hanging_trainer_python,
    r5_gateway_forwards,
    r6_socket_connections,
    r7_member_names,
    r8_cli_log,
    r9_costs_day,
    r10_version_storm,
    r12_notifications,
    s1_tail_of_10mb,
    s2_huge_watts,
)
from bench.attacks_keys import issue_limit_keys, k1_other_models, k2_budget_burst
from bench.attacks_push import l1_viewer_pushes, l2_hostile_texts
from bench.attacks_r3 import r3_engine_of_another_user
from bench.attacks_routes import e1_huge_embeddings, e2_huge_rerank, e3_mapped_doors
from bench.attacks_rpc import x1_rpc_doors
from bench.attacks_tools import t1_hostile_tools
from bench.common import percentile
from console.client import FleetClient

FD_LIMIT = 1024
FLOOD_CONNECTIONS = 1100
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
GATEWAY_MODEL = "cloud-small"


def launch_agent(demo: DemoLab) -> subprocess.Popen:
    """The demo's agent for `box` as a real process with systemd's default fd limit; its log in DIR/agent.log."""

    def limit_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    with open(demo.dir / "agent.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agents.shell.daemon",
                "--log-level",
                "warning",
                "serve",
                "--lab",
                str(demo.lab_path),
                "--machine",
                "box",
                "--state-dir",
                str(demo.dir / "agents" / "box"),
            ],
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


async def issue_attacker_gateway_key(demo: DemoLab, client: FleetClient) -> None:
    """A gateway key of the attacker's own (the legitimate client keeps the demo key)."""
    if load_lab(demo.lab_path).gateway is not None and not (demo.dir / ATTACKER_GATEWAY_KEY).exists():
        token = (await request(client, "box", GATEWAY_KEYS_ADD, KeyAddParams(name="mallory"))).key
        (demo.dir / ATTACKER_GATEWAY_KEY).write_text(token + "\n")


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


# ---------------------------------------------------------------------------- the attacks: each runs for `seconds`


async def flood_connections(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """1,100 idle TCP connections (from ten loopback addresses), held; meanwhile a new operator console connects."""
    port = load_lab(demo.lab_path).machine("box").port
    held: list[socket.socket] = []
    try:
        for i in range(FLOOD_CONNECTIONS):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 10}", 0))
            s.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port)), 2)
            except (TimeoutError, OSError):
                s.close()
                continue
            held.append(s)
        results["flood_opened"] = len(held)
        started = time.monotonic()
        late = FleetClient(load_lab(demo.lab_path), subscribe=[], reconnect=False)
        await late.start()
        try:
            await late.wait_connected(20)
            results["late_console_online"] = late.state.machines["box"].online
            results["late_console_connect_s"] = time.monotonic() - started
            await late.call("box", "jobs.list", timeout=10)  # an fd-hungry action works meanwhile
            results["late_console_jobs_list"] = "ok"
        finally:
            await late.stop()
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
    finally:
        for s in held:
            s.close()


async def flood_history(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """history max_points 3600 at 190/s, not reading a reply until the end; then how many of them ran."""
    conn, writer, reader = await open_channel(demo, viewer)
    line = json.dumps({"id": 1, "method": "history", "params": {"max_points": 3600}}).encode() + b"\n"
    sent = 0
    codes: dict[str, int] = {}
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            writer.write(line * 19)
            sent += 19
            await asyncio.sleep(0.1)
        try:
            async with asyncio.timeout(3):  # now read what came back (the agent stopped reading us meanwhile)
                while True:
                    reply = await read_line(reader)
                    if not reply:
                        break
                    code = json.loads(reply).get("error", {}).get("code", "ran")
                    codes[code] = codes.get(code, 0) + 1
        except TimeoutError:
            pass
    finally:
        results["history_sent"], results["history_answers"] = sent, codes
        conn.abort()


async def flood_subscribe(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """subscribe with 80,000 topics a line (~750 KB), 2 lines/s, reading the replies."""
    conn, writer, reader = await open_channel(demo, viewer)
    line = json.dumps({"id": 1, "method": "subscribe", "params": {"topics": [f"t{i}" for i in range(80_000)]}}).encode() + b"\n"
    answers = []

    async def read() -> None:
        while True:
            got = await reader.readline()
            if not got:
                return
            answers.append(json.loads(got).get("error", {}).get("code"))

    reading = asyncio.create_task(read())
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            writer.write(line)
            await asyncio.sleep(0.5)
    finally:
        results["subscribe_answers"] = sorted(set(filter(None, answers)))
        reading.cancel()
        conn.abort()


async def flood_channels(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """1,000 channels on one connection (each tried; the agent opens only its cap)."""
    conn, _writer, _reader = await open_channel(demo, viewer)
    opened, refused = 1, 0
    try:
        for _ in range(999):
            try:
                await conn.open_session(subsystem="cetlab", encoding=None)
                opened += 1
            except asyncssh.ChannelOpenError:
                refused += 1
        results["channels_opened"], results["channels_refused"] = opened, refused
        await asyncio.sleep(seconds)
    finally:
        conn.abort()


async def flood_refusals(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """A viewer calling an operator method as fast as its budget lets it (reading the refusals)."""
    conn, writer, reader = await open_channel(demo, viewer)
    line = json.dumps({"id": 1, "method": "set_interval", "params": {"interval_s": 1}}).encode() + b"\n"
    codes: dict[str, int] = {}

    async def read() -> None:
        while True:
            got = await reader.readline()
            if not got:
                return
            code = json.loads(got).get("error", {}).get("code", "ok")
            codes[code] = codes.get(code, 0) + 1

    reading = asyncio.create_task(read())
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            writer.write(line * 50)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
    finally:
        results["refusal_codes"] = codes
        reading.cancel()
        conn.abort()


async def flood_gateway(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N3: 1,100 idle TCP connections to the gateway port (ten loopback addresses), held; meanwhile a new operator
    console connects and a new gateway client asks once."""
    lab = load_lab(demo.lab_path)
    assert lab.gateway is not None
    held: list[socket.socket] = []
    try:
        for i in range(FLOOD_CONNECTIONS):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 10}", 0))
            s.setblocking(False)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", lab.gateway.port)), 2)
            except (TimeoutError, OSError):
                s.close()
                continue
            held.append(s)
        results["flood_opened"] = len(held)
        started = time.monotonic()
        late = FleetClient(lab, subscribe=[], reconnect=False)
        await late.start()
        try:
            await late.wait_connected(20)
            results["late_console_online"] = late.state.machines["box"].online
            await late.call("box", "jobs.list", timeout=10)
            results["late_console_jobs_list"] = "ok"
        except Exception as exc:  # the figure, not the end of the bench
            results["late_console_jobs_list"] = f"failed: {exc}"[:120]
        finally:
            await late.stop()
        url, key = gateway_url_and_key(demo)
        payload = {"model": GATEWAY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.post(f"{url}/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}) as r:
                    results["late_gateway_status"] = r.status
        except Exception as exc:
            results["late_gateway_status"] = f"failed: {exc or type(exc).__name__}"[:120]
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        closed = 0
        for s in held:  # how many the gateway closed meanwhile (each read: b"" closed, or nothing yet)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        results["flood_closed_by_gateway"] = closed
    finally:
        for s in held:
            s.close()


async def _mallory_tokens_today(demo: DemoLab, viewer: Path) -> int:
    """The attacker's gateway key's tokens today, as the gateway's section says."""
    return await key_tokens_today(demo, viewer, "mallory")


async def dropped_streams(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N1: streams of 400 tokens from the provider, each dropped after 20 events, 10 at a time, for the window;
    then what the gateway metered against what was read."""
    url, key = gateway_url_and_key(demo, attacker=True)
    before = await _mallory_tokens_today(demo, viewer)
    payload = {"model": GATEWAY_MODEL, "stream": True, "max_tokens": 400, "messages": [{"role": "user", "content": "talk"}]}
    read = streams = 0

    async def one(session: aiohttp.ClientSession) -> int:
        got = 0
        async with session.post(f"{url}/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}) as r:
            async for line in r.content:
                got += line.startswith(b"data:")
                if got >= 20:
                    break
            r.close()
        return got

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            got = await asyncio.gather(*(one(session) for _ in range(8)), return_exceptions=True)
            read += sum(g for g in got if isinstance(g, int))
            streams += len(got)
    await asyncio.sleep(2.0)  # the gateway's meter settles the last ones
    after = await _mallory_tokens_today(demo, viewer)
    results.update(dropped_streams=streams, events_read=read, tokens_metered=after - before)


async def abandoned_requests(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N8: a key sends 20 requests for 200 tokens at once and leaves each after 0.3 s, over and over."""
    url, key = gateway_url_and_key(demo, attacker=True)
    payload = {"model": GATEWAY_MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "think"}]}
    codes: dict[str, int] = {}

    async def one(session: aiohttp.ClientSession) -> None:
        try:
            async with session.post(
                f"{url}/chat/completions",
                json=payload,
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=0.3),
            ) as r:
                code = str(r.status)
        except TimeoutError:
            code = "left"
        codes[code] = codes.get(code, 0) + 1

    async with aiohttp.ClientSession() as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.gather(*(one(session) for _ in range(20)))
    results["abandoned_codes"] = codes


async def many_connections_one_key(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N6: one viewer key opens 400 connections, each asking history (3,600 points) 190 times a second, never reading."""
    line = json.dumps({"id": 1, "method": "history", "params": {"max_points": 3600}}).encode() + b"\n"
    held: list[tuple[asyncssh.SSHClientConnection, asyncssh.SSHWriter, asyncssh.SSHReader]] = []
    refused = 0
    for _ in range(400):
        try:
            held.append(await open_channel(demo, viewer))
        except (asyncssh.Error, OSError):
            refused += 1
    results["key_connections_opened"], results["key_connections_refused"] = len(held), refused
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _, writer, _ in held:
                writer.write(line * 19)
            await asyncio.sleep(0.1)
    finally:
        for conn, _, _ in held:
            conn.abort()


async def login_storm(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N10: new idle TCP connections to the SSH port from the console's own address (127.0.0.1), as fast as they open
    (the issue measured 2,000 a second), each held until the agent closes it or 900 newer ones are open."""
    await connection_storm(demo, seconds, results)


ATTACKS: dict[str, Callable[[DemoLab, Path, float, dict], Awaitable[None]]] = {
    "5 idle TCP flood": flood_connections,
    "6 history, unread": flood_history,
    "6 subscribe topics": flood_subscribe,
    "6 1,000 channels": flood_channels,
    "7 refused calls": flood_refusals,
    "N1 dropped streams": dropped_streams,
    "N3 gateway idle flood": flood_gateway,
    "N6 400 connections of one key": many_connections_one_key,
    "N8 abandoned requests": abandoned_requests,
    "N10 login storm": login_storm,
    "R1 n choices on a tiny quota": r1_choices,
    "R2 two length fields on a tiny quota": r2_lengths,
    "R3 an engine, as another user": r3_engine_of_another_user,
    "R4 a trainer Python that never answers": r4_hanging_trainer_python,
    "R7 orchestra member names": r7_member_names,
    "R8 agent text in the CLI's log": r8_cli_log,
    "R9 markup in costs' day": r9_costs_day,
    "R5 the gateway key's forwards": r5_gateway_forwards,
    "R6 100 socket connections of one uid": r6_socket_connections,
    "R10 version-line storm": r10_version_storm,
    "R12 a refusing endpoint and a flapping alert": r12_notifications,
    "S1 --tail 10000 of a 10 MB log": s1_tail_of_10mb,
    "S2 idle_watts 1e300 in lab.yaml": s2_huge_watts,
    "L1 a viewer pushes a lab.yaml": l1_viewer_pushes,
    "L2 hostile lab.yaml texts pushed": l2_hostile_texts,
    "K1 a key limited to one model asks another": k1_other_models,
    "K2 bursts past a key's money budget": k2_budget_burst,
    "T1 hostile tools and schemas": t1_hostile_tools,
    "E1 a huge input list on /v1/embeddings": e1_huge_embeddings,
    "E2 a thousand documents on /v1/rerank": e2_huge_rerank,
    "E3 the Responses and Messages doors": e3_mapped_doors,
    "C4 hostile names at every name field": c4_hostile_names,
    "X1 a viewer at the rpc-helper doors": x1_rpc_doors,
}


async def run_attack(demo: DemoLab, viewer: Path, name: str, seconds: float) -> dict:
    """One attack in its own process (its client-side work must not slow the console we measure); its results."""
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
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"attack {name!r} failed: {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def measure(
    demo: DemoLab, agent_pid: int, console: Console, viewer: Path, name: str, seconds: float, settle_s: float = 0.0
) -> dict:
    """One attack: the console's window without it, then with it; the agent's fds and RSS around it (and `settle_s` after)."""
    proc = psutil.Process(agent_pid)
    await issue_attacker_gateway_key(demo, console.client)
    await issue_quota_keys(demo, console.client)
    await issue_limit_keys(demo, console.client)
    logins = name.startswith(("N10", "R10"))  # attacks at the login door: fresh logins measured too
    quiet = await console.window(seconds, logins)
    fds0, rss0 = proc.num_fds(), proc.memory_info().rss
    attack = asyncio.create_task(run_attack(demo, viewer, name, seconds))
    await asyncio.sleep(0.3)  # the attacker's interpreter starting
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
    await ATTACKS[name](DemoLab(lab_path.parent, source=lab_path), key, seconds, results)
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
            for name in ATTACKS:
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
    parser.add_argument("--attack", choices=list(ATTACKS), help=argparse.SUPPRESS)
    parser.add_argument("--lab", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, dest="attack_seconds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        asyncio.run(attack_main(args.attack, args.lab, args.key, args.attack_seconds))
    else:
        asyncio.run(main(args.seconds, args.only.split(",") if args.only else None, args.settle))
