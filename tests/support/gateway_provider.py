"""What tests/e2e/gateway/test_lengths_through_the_gateway.py, tests/e2e/gateway/test_money_and_doors.py share:
UPSTREAM_PORT, PRICE, LAB, gw_demo, Gw, gw."""

from __future__ import annotations

import sqlite3

import aiohttp
import psutil
import pytest

from agents.shell.demo.lab import DemoLab, free_ports
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import P4, gateway_key, running_lab
from tests.support.gateway_upstream import Upstream
from tests.support.waits import wait_for

UPSTREAM_PORT = free_ports(1)[0]


PRICE = 3.50  # per million tokens, the 405B's price in the field notes


LAB = {
    "lab": "gw-hardening",
    "machines": [{"name": "box", "gpus": {"sim": [P4]}}],
    "gateway": {"machine": "box", "policies": {"first_request_s": 2, "idle_s": 2, "key_concurrency": 8, "max_tokens": 4096}},
    "providers": [
        {
            "name": "cloud",
            "base_url": f"http://127.0.0.1:{UPSTREAM_PORT}/v1",
            "models": [
                {"name": "big", "prompt_per_million": PRICE, "completion_per_million": PRICE},
                {"name": "slow"},
                {"name": "endless"},
                {"name": "huge"},
            ],
        },
        {
            "name": "pricey",
            "base_url": f"http://127.0.0.1:{UPSTREAM_PORT}/v1",
            "monthly_budget": 0.05,
            "models": [{"name": "premium", "upstream": "big", "prompt_per_million": 1000, "completion_per_million": 1000}],
        },
    ],
}


@pytest.fixture(scope="module")
def gw_demo(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "gwh") as demo:
        yield demo


class Gw:
    def __init__(self, demo: DemoLab, client: FleetClient, session: aiohttp.ClientSession, upstream: Upstream):
        self.demo, self.client, self.session, self.upstream = demo, client, session, upstream
        lab = load_lab(demo.lab_path)
        self.url = f"http://{lab.gateway.host}:{lab.gateway.port}/v1"
        self.key = gateway_key(demo)
        self.agent = psutil.Process(demo.processes[-1].pid)

    def headers(self, key: str | None = None) -> dict:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def chat(self, model: str, key: str | None = None, **body) -> tuple[int, dict]:
        payload = {"model": model, "messages": [{"role": "user", "content": "say something"}], **body}
        async with self.session.post(f"{self.url}/chat/completions", json=payload, headers=self.headers(key)) as r:
            return r.status, await r.json(content_type=None)

    async def status(self) -> dict:
        return await self.client.call("box", "gateway.status")

    async def spend(self, provider: str) -> float:
        return next(p["spend_month"] for p in (await self.status())["providers"] if p["name"] == provider)

    async def key_tokens(self, name: str) -> int:
        return next(k["tokens_today"] for k in (await self.status())["keys"] if k["name"] == name)

    async def new_key(self, name: str, **quota) -> str:
        return (await self.client.call("box", "gateway.keys.add", {"name": name, **quota}))["key"]

    def rows(self, sql: str) -> list:
        with sqlite3.connect(self.demo.dir / "agents" / "box" / "state.db") as db:
            return db.execute(sql).fetchall()


@pytest.fixture
async def gw(gw_demo):
    upstream = Upstream(port=UPSTREAM_PORT)
    await upstream.start()
    try:
        async with FleetClient(load_lab(gw_demo.lab_path), subscribe=[]) as client, aiohttp.ClientSession() as session:
            await client.wait_connected(20)
            g = Gw(gw_demo, client, session, upstream)
            await wait_for(lambda: g.status(), timeout=20)
            yield g
    finally:
        await upstream.stop()
