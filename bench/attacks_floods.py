"""The first probes (issue 11: findings 5, 6, 7; issue 21: N1, N3, N6, N8, N10), run by bench/bench_attacks.py like its
others: floods of connections, channels and calls at the agent and its gateway, streams and requests left half-way.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import aiohttp
import asyncssh

from agents.runtime.link import read_line
from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.gateway import GATEWAY_KEYS_ADD, KeyAddParams
from agents.wire.catalogue.method import request
from agents.wire.lab.model import load_lab
from bench.attacks_connections import connection_storm, open_channel
from bench.attacks_quota import ATTACKER_GATEWAY_KEY, gateway_url_and_key, key_tokens_today
from bench.probes import before, probe
from console.lab.client import FleetClient

FLOOD_CONNECTIONS = 1100
GATEWAY_MODEL = "cloud-small"  # bench_attacks' LAB sells it: what its legitimate gateway client and N1, N3, N8 ask


@before
async def issue_attacker_gateway_key(demo: DemoLab, client: FleetClient) -> None:
    """A gateway key of the attacker's own (the legitimate client keeps the demo key)."""
    if load_lab(demo.lab_path).gateway is not None and not (demo.dir / ATTACKER_GATEWAY_KEY).exists():
        token = (await request(client, "box", GATEWAY_KEYS_ADD, KeyAddParams(name="mallory"))).key
        (demo.dir / ATTACKER_GATEWAY_KEY).write_text(token + "\n")


@probe("5 idle TCP flood")
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
                await within(asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port)), 2)
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


@probe("6 history, unread")
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


@probe("6 subscribe topics")
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


@probe("6 1,000 channels")
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


@probe("7 refused calls")
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


@probe("N3 gateway idle flood")
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
                await within(asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", lab.gateway.port)), 2)
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


@probe("N1 dropped streams")
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


@probe("N8 abandoned requests")
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


@probe("N6 400 connections of one key")
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


@probe("N10 login storm", logins=True)
async def login_storm(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """N10: new idle TCP connections to the SSH port from the console's own address (127.0.0.1), as fast as they open
    (the issue measured 2,000 a second), each held until the agent closes it or 900 newer ones are open."""
    await connection_storm(demo, seconds, results)
