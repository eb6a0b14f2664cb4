"""The model pool's test helpers: a two-GPU sim lab, sim models, settling a model, posting to an engine."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from agents.orchestra.engine import UnixHTTPConnection
from agents.wire.engine_address import UNIX_PREFIX
from console.lab.client import FleetClient
from tests.support.waits import wait_for

FAST = {"load_s": 0.2, "warmup_s": 0.3, "wake_s": 0.1, "tokens_per_s": 400, "placeholder_mib": 2}


def pool_lab(models: list[dict], orchestra: dict | None = None, ram_cache_gib: float | None = None) -> dict:
    machine = {
        "name": "box",
        "gpus": {
            "sim": [
                {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250},
                {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75},
            ]
        },
    }
    if ram_cache_gib is not None:
        machine["ram_cache_gib"] = ram_cache_gib
    return {"lab": "pool-lab", "machines": [machine], "models": models, "orchestra": orchestra or {}}


def sim_model(name: str, gpus: list[int], vram_gib: float, **sim) -> dict:
    return {
        "name": name,
        "path": f"models/{name}",
        "engine": "sim",
        "machine": "box",
        "gpus": gpus,
        "vram_gib": vram_gib,
        "sim": {**FAST, **sim},
    }


async def settle(client: FleetClient, name: str, states: tuple[str, ...], timeout: float = 30.0, machine: str = "box") -> dict:
    """Poll models.get until the model is in one of the states with no operation running."""
    found: dict = {}

    async def check() -> bool:
        found.update(await client.call(machine, "models.get", {"model": name}))
        return found["state"] in states and not found["op"]

    try:
        await wait_for(check, timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(
            f"{name} did not reach {states}: {found['state']} {found.get('progress')} {found.get('error')}"
        ) from None
    return found


def engine_http(url: str, body: object | None = None, method: str | None = None) -> tuple[int, bytes]:
    """A request to an engine at ``url``: its endpoint without /v1, then the path (``unix:/run/engine.sock/metrics``
    over its socket, ``http://127.0.0.1:PORT/metrics`` where it is on a port); POST when there is a body, unless
    ``method`` says."""
    if url.startswith(UNIX_PREFIX):
        sock, _, path = url[len(UNIX_PREFIX) :].partition(".sock")
        connection: http.client.HTTPConnection = UnixHTTPConnection(sock + ".sock", 30)
    else:
        parts = urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    try:
        connection.request(
            method or ("GET" if data is None else "POST"),
            path or "/",
            body=data,
            headers={"Content-Type": "application/json"} if data else {},
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def post(endpoint: str, path: str, body: dict) -> tuple[int, dict]:
    status, raw = engine_http(endpoint.removesuffix("/v1") + path, body)
    return status, json.loads(raw or b"{}")
