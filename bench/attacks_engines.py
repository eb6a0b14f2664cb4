"""The engines' endpoints against another user of their machine (issue 30: R3), run by bench/bench_attacks.py like its
others: another user of the agent's machine (uid nobody, in a forked child: the bench runs as root) at a warm engine's endpoint, as `models.list` names it.

Before: engines listened on 127.0.0.1 with no key, so that user generated unmetered, put the model to sleep (the agent
still said "warm", and the operator's next request through the gateway never came back) and called /collective_rpc.
After: the engine is on a unix socket in a 0700 folder of the agent's, and every request of that user fails at
connect(); the operator's gateway still gets its answer."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pwd
from pathlib import Path

import aiohttp

from agents.orchestra.engine import UnixHTTPConnection
from agents.shell.demo.lab import DemoLab
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import load_lab
from bench.attacks_quota import gateway_url_and_key
from bench.probes import probe
from console.lab.client import FleetClient

R3_MODEL = "r3-sim"  # the bench lab's one engine (a simulated vLLM), warmed by the operator before the attack
GATEWAY_WAIT_S = 20.0
ATTEMPTS = (
    ("GET", "/health", None),
    ("POST", "/v1/completions", {"model": R3_MODEL, "prompt": "free tokens", "max_tokens": 16}),
    ("POST", "/sleep?level=1&mode=abort", None),
    ("POST", "/collective_rpc", {"method": "reload_weights"}),
)


def _ask(endpoint: str, method: str, path: str, body: dict | None) -> int:
    """One request at an engine's endpoint (its socket, or 127.0.0.1:PORT as engines listened before)."""
    address = EngineAddress.parse(endpoint)
    connection = (
        UnixHTTPConnection(address.socket, 10)
        if address.socket is not None
        else http.client.HTTPConnection("127.0.0.1", address.port, timeout=10)
    )
    try:
        data = json.dumps(body or {}).encode()
        connection.request(method, path, body=data if method == "POST" else None, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _as_nobody(endpoint: str) -> list[str]:
    """Each of ATTEMPTS from a forked child running as nobody: its status, or why it could not ask."""
    nobody = pwd.getpwnam("nobody")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no threads used
        outcomes = []
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            for method, path, body in ATTEMPTS:
                try:
                    outcomes.append(f"{method} {path.split('?')[0]}: {_ask(endpoint, method, path, body)}")
                except OSError as exc:
                    outcomes.append(f"{method} {path.split('?')[0]}: {type(exc).__name__} ({exc.strerror})")
        finally:
            os.write(write_fd, json.dumps(outcomes).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return list(json.loads(data or "[]"))


async def _info(fleet: FleetClient) -> dict:
    listing = await fleet.call("box", "models.list")
    return dict(next(m for m in listing["models"] if m["name"] == R3_MODEL))


@probe("R3 an engine, as another user")
async def r3_engine_of_another_user(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R3: uid nobody at the warm engine's endpoint: generation, /sleep, /collective_rpc (before: all answered 200)."""
    if os.geteuid() != 0:
        results["r3"] = {"skipped": "acting as another user needs root"}
        return
    async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as fleet:
        await fleet.wait_connected(20)
        await fleet.call("box", "models.warm", {"model": R3_MODEL})
        for _ in range(600):  # the operator's warm: the attack starts once it is done
            if (info := await _info(fleet))["state"] == "warm":
                break
            await asyncio.sleep(0.1)
        outcomes = await asyncio.to_thread(_as_nobody, info["endpoint"])
        url, key = gateway_url_and_key(demo)
        gateway: int | str
        try:  # the operator's own request through the gateway: a model slept behind the agent's back never answers it
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=GATEWAY_WAIT_S)) as session:
                body = {"model": R3_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                async with session.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                    gateway = r.status
        except TimeoutError:
            gateway = f"no answer in {GATEWAY_WAIT_S:g} s"
        results["r3"] = {
            "endpoint": info["endpoint"],
            "nobody": outcomes,
            "agent_says": (await _info(fleet))["state"],
            "gateway": gateway,
        }
