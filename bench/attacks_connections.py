"""Probes of connections (issue 30: R6, R10): 100 unix-socket connections of one uid, and a storm of version lines at
the login door; the connection storm and the raw channel other probes use."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import asyncssh

from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from bench.probes import probe


@probe("R10 version-line storm", logins=True)
async def r10_version_storm(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R10: new connections to the SSH port from the console's own address, each sending an SSH version line and
    nothing more (no key needed), as fast as they open; each held until the agent closes it or 900 newer are open."""
    await connection_storm(demo, seconds, results, b"SSH-2.0-OpenSSH_9.6\r\n")


async def connection_storm(demo: DemoLab, seconds: float, results: dict, greeting: bytes = b"") -> None:
    """New TCP connections to the agent's SSH port from 127.0.0.1, as fast as they open (about 2,000 a second at
    most), each sending ``greeting`` (nothing: idle) and held until the agent closes it or 900 newer are open."""
    import resource
    import socket

    port = load_lab(demo.lab_path).machine("box").port
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held: list[socket.socket] = []
    opened = 0
    loop = asyncio.get_running_loop()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            s = socket.socket()
            s.setblocking(False)
            try:
                await within(loop.sock_connect(s, ("127.0.0.1", port)), 1)
                if greeting:
                    s.send(greeting)
            except (TimeoutError, OSError):
                s.close()
                continue
            opened += 1
            held.append(s)
            if len(held) > 900:
                held.pop(0).close()
            if opened % 20 == 0:
                await asyncio.sleep(0.01)  # ~2,000 a second at most
    finally:
        for s in held:
            s.close()
    results["storm_opened"] = opened
    results["storm_rate_per_s"] = round(opened / seconds)


@probe("R6 100 socket connections of one uid")
async def r6_socket_connections(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R6: one local user with 100 connections to the agent's unix socket, each sending pings as fast as they are
    answered (the socket applied no per-principal caps: 12,238 answers/s, a console's ping p50 1.3 s)."""
    path = demo.dir / "agents" / "box" / "agent.sock"
    ping = b'{"id": 1, "method": "ping"}\n' * 50
    codes: dict[str, int] = {}
    end = time.monotonic() + seconds

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
        except OSError as exc:
            codes[f"connect: {exc.strerror}"] = codes.get(f"connect: {exc.strerror}", 0) + 1
            return
        try:
            while time.monotonic() < end:
                writer.write(ping)
                for _ in range(50):
                    line = await reader.readline()
                    if not line:
                        codes["closed"] = codes.get("closed", 0) + 1
                        return
                    code = str(json.loads(line).get("error", {}).get("code", "ok"))
                    codes[code] = codes.get(code, 0) + 1
                    if code != "ok" and "open to this agent" in json.loads(line)["error"]["message"]:
                        return  # refused at the door
        except (ConnectionError, ValueError):
            codes["closed"] = codes.get("closed", 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(100)))
    results["r6"] = {"answers_per_s": round(codes.get("ok", 0) / seconds), **codes}


async def open_channel(demo: DemoLab, key: Path) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHWriter, asyncssh.SSHReader]:
    lab = load_lab(demo.lab_path)
    m = lab.machine("box")
    conn = await asyncssh.connect(
        m.host,
        m.port,
        username="cetlab",
        client_keys=[str(key)],
        known_hosts=str(lab.resolve(lab.console.known_hosts)),
        agent_path=None,
        config=None,
    )
    writer, reader, _ = await conn.open_session(subsystem="cetlab", encoding=None)
    return conn, writer, reader
