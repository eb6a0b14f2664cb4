"""Probes of the gateway keys' limits (issue 31, item 3), run by bench/bench_attacks.py like its others.

K1: a key limited to one model asks another every way a client can name it (its name, `provider/name`, an orchestra
fan-out with it as a member, GET /v1/models/NAME) and lists /v1/models: every door must refuse it.
K2: a key with a budget of a few hundred tokens' worth sends 40 requests at once, again and again for the window: what
the gateway says it spent must stay within its budget (the holds are taken before a request goes upstream)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.gateway import GATEWAY_KEYS_ADD, GATEWAY_STATUS, KeyAddParams
from agents.wire.catalogue.method import request
from agents.wire.lab.gateway import KeyBudget
from agents.wire.lab.model import load_lab
from bench.attacks_quota import gateway_url_and_key
from bench.probes import before, probe
from console.lab.client import FleetClient

ALLOWED, OTHER = "cloud-small", "cloud-large"  # bench_attacks' LAB sells both
BUDGET = 0.0005  # at 3.5 per million tokens: about 140 tokens


@before
async def issue_limit_keys(demo: DemoLab, client: FleetClient) -> None:
    """K1's key (one model) and K2's key (a tiny money budget), once per lab."""
    if load_lab(demo.lab_path).gateway is None:
        return
    for params in (
        KeyAddParams(name="onlysmall", models=[ALLOWED]),
        KeyAddParams(name="pennies", budget=KeyBudget(amount=BUDGET, period="day")),
    ):
        if not (demo.dir / f"{params.name}.gateway.key").exists():
            token = (await request(client, "box", GATEWAY_KEYS_ADD, params)).key
            (demo.dir / f"{params.name}.gateway.key").write_text(token + "\n")


@probe("K1 a key limited to one model asks another")
async def k1_other_models(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """K1: every way of naming a model the key may not use; the status each door answered, and what it lists."""
    url, key = gateway_url_and_key(demo, name="onlysmall")
    headers = {"Authorization": f"Bearer {key}"}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    codes: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for label, path, body in (
            ("allowed", "/chat/completions", {**chat, "model": ALLOWED}),
            ("name", "/chat/completions", {**chat, "model": OTHER}),
            ("provider/name", "/chat/completions", {**chat, "model": f"cloud/{OTHER}"}),
            ("fan-out", "/orchestra/chat/completions", {**chat, "models": [ALLOWED, OTHER], "deadline_s": 10}),
        ):
            async with session.post(url + path, json=body, headers=headers) as r:
                codes[label] = r.status
                await r.read()
        async with session.get(f"{url}/models/{OTHER}", headers=headers) as r:
            codes["GET /models/NAME"] = r.status
        async with session.get(f"{url}/models", headers=headers) as r:
            listed = sorted(m["id"] for m in (await r.json())["data"])
    results["k1"] = {"codes": codes, "listed": listed}


@probe("K2 bursts past a key's money budget")
async def k2_budget_burst(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """K2: bursts of 40 concurrent requests on a key of a tiny budget for the window; spent against the budget."""
    url, key = gateway_url_and_key(demo, name="pennies")
    body = {"model": ALLOWED, "messages": [{"role": "user", "content": "talk"}], "max_tokens": 50}
    codes: dict[int, int] = {}

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            codes[r.status] = codes.get(r.status, 0) + 1
            await r.read()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.gather(*(one(session) for _ in range(40)))
    async with FleetClient(load_lab(demo.lab_path), key_path=viewer, subscribe=[], reconnect=False) as client:
        await client.wait_connected(20)
        section = (await request(client, "box", GATEWAY_STATUS)).root
    assert section is not None, "the gateway does not run"
    use = next(k for k in section.keys if k.name == "pennies")
    results["k2"] = {"codes": codes, "spent": use.spent, "budget": BUDGET, "within": use.spent <= BUDGET}
