"""The lab gateway end to end: real HTTP through a real agent, to sim engines on two machines over real SSH, and a stand-in provider."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import stat
import subprocess
import sys

import aiohttp
import pytest

from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.gateway import gateway_key, running_lab
from tests.support.gateway_two_machines import LAB
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def gw_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "gw") as demo:
        yield demo


class Gw:
    """The test's view of the running gateway: its URL, the demo key, an operator FleetClient."""

    def __init__(self, demo: DemoLab, client: FleetClient, session: aiohttp.ClientSession):
        self.demo, self.client, self.session = demo, client, session
        lab = load_lab(demo.lab_path)
        self.url = f"http://{lab.gateway.host}:{lab.gateway.port}"
        self.key = gateway_key(demo)

    def headers(self, key: str | None = None, **extra: str) -> dict:
        return {"Authorization": f"Bearer {key or self.key}", **extra}

    async def chat(self, model: str, key: str | None = None, headers: dict | None = None, **body) -> tuple[int, dict, dict]:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": body.pop("content", "hello there")}],
            "max_tokens": 8,
            **body,
        }
        async with self.session.post(
            f"{self.url}/v1/chat/completions", json=payload, headers={**self.headers(key), **(headers or {})}
        ) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)

    async def model_state(self, machine: str, name: str) -> str:
        listing = await self.client.call(machine, "models.list")
        return next(m for m in listing["models"] if m["name"] == name)["state"]

    async def status(self) -> dict:
        return await self.client.call("hub", "gateway.status")


@pytest.fixture
async def gw(gw_lab):
    lab = load_lab(gw_lab.lab_path)
    async with FleetClient(lab, subscribe=[]) as client, aiohttp.ClientSession() as session:
        await client.wait_connected(20)
        g = Gw(gw_lab, client, session)

        async def ready():
            try:
                async with session.get(f"{g.url}/health") as r:
                    ok = r.status == 200
            except aiohttp.ClientError:
                return False
            states = {m["name"]: m["state"] for m in (await g.status())["models"]}
            return (
                ok
                and all(states.get(n) == "warm" for n in ("fast-a", "fast-b", "meter-me", "crawler", "streamer"))
                and states.get("sleepy") == "sleeping"
                and states.get("broken") == "failed"
                and all(v == "online" for v in (await g.status())["peers"].values())
            )

        if await g.model_state("node", "broken") == "cold":  # not in the start plan: its failure would cut the plan short
            await client.call("node", "models.warm", {"model": "broken"})
        await wait_for(ready, timeout=60, interval=0.2)
        yield g


async def test_routes_to_warm_models_on_two_machines_and_aliases(gw):
    for name, machine in (("fast-a", "hub"), ("alpha", "hub"), ("fast-b", "node")):
        status, body, headers = await gw.chat(name)
        assert status == 200, body
        assert headers["x-cetlab-tier"] == "local" and headers["x-cetlab-target"] == machine
        assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["message"]["content"]


async def test_provider_tier_and_models_list(gw):
    status, body, headers = await gw.chat("cloud-big")
    assert status == 200, body
    assert (
        headers["x-cetlab-tier"] == "provider"
        and headers["x-cetlab-target"] == "cloud"
        and headers["x-cetlab-simulated"] == "true"
    )
    async with gw.session.get(f"{gw.url}/v1/models", headers=gw.headers()) as r:
        data = (await r.json())["data"]
    tiers = {m["id"]: m["tier"] for m in data}
    assert tiers["fast-a"] == "local" and tiers["cloud-big"] == "provider" and tiers["premium"] == "provider"
    assert next(m for m in data if m["id"] == "sleepy")["state"] in ("sleeping", "loading", "warm")


async def test_wrong_key_is_401_and_revoked_key_refused(gw):
    status, body, _ = await gw.chat("fast-a", key="cetlab-gw-not-a-key")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    async with gw.session.get(f"{gw.url}/v1/models") as r:
        assert r.status == 401
    issued = await gw.client.call("hub", "gateway.keys.add", {"name": "temp"})
    assert (await gw.chat("fast-a", key=issued["key"]))[0] == 200
    await gw.client.call("hub", "gateway.keys.revoke", {"name": "temp"})
    assert (await gw.chat("fast-a", key=issued["key"]))[0] == 401
    listing = (await gw.client.call("hub", "gateway.keys.list"))["keys"]
    assert next(k for k in listing if k["name"] == "temp")["revoked_at"] is not None
    assert all("sha256" not in k and "key" not in k for k in listing)


async def test_rpm_quota(gw):
    issued = await gw.client.call("hub", "gateway.keys.add", {"name": "limited", "rpm": 2})
    assert [(await gw.chat("fast-a", key=issued["key"]))[0] for _ in range(3)] == [200, 200, 429]


async def test_tokens_per_day_quota(gw):
    # the prompt is held at its bound (31: its bytes and the template's markers), so 31 + 8 would pass the 38:
    # max_tokens lowered to 7; the engine counts 3 prompt tokens, so 10 are charged, and the next one's bound does not fit
    issued = await gw.client.call("hub", "gateway.keys.add", {"name": "daily", "tokens_per_day": 38})
    status, body, _ = await gw.chat("fast-a", key=issued["key"])
    assert status == 200 and body["usage"]["total_tokens"] == 10
    status, body, _ = await gw.chat("fast-a", key=issued["key"])
    assert status == 429 and body["error"]["code"] == "quota_exceeded" and "tokens per day" in body["error"]["message"]


async def test_streaming_passes_every_chunk(gw):
    payload = {
        "model": "streamer",
        "messages": [{"role": "user", "content": "stream me"}],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = []
    async with gw.session.post(f"{gw.url}/v1/chat/completions", json=payload, headers=gw.headers()) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 20
    status, body, _ = await gw.chat("streamer", content="stream me", max_tokens=20)
    assert text == body["choices"][0]["message"]["content"]  # the engine's answer is a function of the prompt


async def test_a_client_leaving_mid_stream_is_metered_and_the_gateway_keeps_serving(gw):
    async def crawler_errors() -> int:
        return next(m for m in (await gw.status())["models"] if m["name"] == "crawler")["errors"]

    before = await crawler_errors()
    payload = {"model": "crawler", "messages": [{"role": "user", "content": "slowly"}], "max_tokens": 40, "stream": True}
    async with aiohttp.ClientSession() as own:  # its own connection, closed under the stream
        async with own.post(f"{gw.url}/v1/chat/completions", json=payload, headers=gw.headers()) as r:
            assert (await r.content.readline()).startswith(b"data: ")
            r.connection.transport.abort()

    async def errored() -> bool:  # the next token's write finds the client gone
        return await crawler_errors() != before

    await wait_for(errored, timeout=30, interval=0.1)
    assert (await gw.chat("fast-a"))[0] == 200
    db = gw.demo.dir / "agents" / "hub" / "state.db"

    def last_crawler_row():
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute(
                "SELECT status, stream, error FROM gateway_requests WHERE model='crawler' ORDER BY id DESC LIMIT 1"
            ).fetchone()

    assert await wait_for(lambda: last_crawler_row() == (499, 1, "the client closed the stream"))


async def test_wakes_a_sleeping_model_on_request_and_idle_ttl_puts_it_back(gw):
    assert await gw.model_state("node", "sleepy") == "sleeping"
    results = await asyncio.gather(gw.chat("sleepy"), gw.chat("sleepy"))
    assert all(status == 200 for status, _, _ in results), results
    assert all(headers.get("x-cetlab-woke") == "true" for _, _, headers in results)
    figures = next(m for m in (await gw.status())["models"] if m["name"] == "sleepy")
    assert figures["wakes"] == 1  # two requests, one shared wake

    async def asleep() -> bool:  # idle_ttl_s: 2 s
        return await gw.model_state("node", "sleepy") == "sleeping"

    await wait_for(asleep, timeout=30, interval=0.2)


async def test_loads_a_cold_model_behind_the_queue(gw):
    assert await gw.model_state("node", "coldie") in ("cold", "cached")
    status, body, headers = await gw.chat("coldie")
    assert status == 200, body
    assert headers["x-cetlab-woke"] == "true" and await gw.model_state("node", "coldie") == "warm"


async def test_full_queue_answers_503_with_retry_after(gw):
    waiting = [asyncio.create_task(gw.chat("slowpoke", headers={"x-cetlab-max-wait-s": "20"})) for _ in range(2)]

    async def queued():
        return next(m for m in (await gw.status())["models"] if m["name"] == "slowpoke")["queued"] == 2

    await wait_for(queued, timeout=20)
    status, body, headers = await gw.chat("slowpoke")
    assert status == 503 and body["error"]["code"] == "queue_full" and headers["Retry-After"] == "5"
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await gw.client.call("hub", "models.cold", {"model": "slowpoke"})


async def test_fallback_on_latency_budget_and_on_failed_engine(gw):
    status, body, headers = await gw.chat("far-away", headers={"x-cetlab-max-wait-s": "2"})
    assert status == 200, body
    assert headers["x-cetlab-tier"] == "provider" and "budget" in headers["x-cetlab-fallback-reason"]
    assert await gw.model_state("hub", "far-away") in ("cold", "cached")  # not brought up: the cloud answered
    status, body, headers = await gw.chat("broken")
    assert status == 200 and headers["x-cetlab-tier"] == "provider" and "failed" in headers["x-cetlab-fallback-reason"]


async def test_orchestra_fan_out_marks_the_model_that_missed_the_deadline(gw):
    payload = {"group": "band", "messages": [{"role": "user", "content": "all of you"}], "max_tokens": 10, "deadline_s": 3}
    async with gw.session.post(f"{gw.url}/v1/orchestra/chat/completions", json=payload, headers=gw.headers()) as r:
        assert r.status == 200
        data = await r.json()
    by_model = {res["model"]: res for res in data["results"]}
    assert data["partial"] is True and data["answered"] == 3 and data["asked"] == 4
    assert by_model["crawler"]["status"] == "timeout"  # 10 tokens at 2 tokens/s
    assert by_model["cloud-big"]["tier"] == "provider" and by_model["cloud-big"]["cost"] > 0
    assert by_model["fast-b"]["tier"] == "local" and by_model["fast-b"]["usage"]["completion_tokens"] == 10
    assert all(set(res) - {"choices", "error", "param"} == set(by_model["fast-b"]) - {"choices"} for res in data["results"])
    assert by_model["crawler"]["http_status"] == 504 and by_model["crawler"]["usage"] is None


async def test_budget_alerts_and_refusal_past_100_percent(gw):
    # 167 completion tokens + 3 prompt tokens at 75 per million: 0.01275 of a 0.015 budget (85%); its hold (the
    # prompt's bound, 31, + 167) fits in the 200 tokens the budget buys
    notices = []
    lab = load_lab(gw.demo.lab_path)
    async with FleetClient(lab, subscribe=["notice"], on_event=lambda m, e, d: notices.append(d)) as listener:
        await listener.wait_connected(20)
        assert (await gw.chat("premium", max_tokens=167))[0] == 200
        await wait_for(lambda: any(n.level == "warning" and "85% of its monthly budget" in n.message for n in notices))
        rules = {(a["rule"], a["target"]) for a in (await listener.call("hub", "alerts.list", {"active": True}))["alerts"]}
        assert ("budget_80", "provider pricey") in rules  # a real alert, on the gateway's machine
        # the next one's worst case (its prompt's bound alone: 0.0023) does not fit in what is left: refused before it goes out
        status, body, _ = await gw.chat("premium", max_tokens=167)
    assert status == 429 and body["error"]["code"] == "budget_exceeded"
    spend = next(p for p in (await gw.status())["providers"] if p["name"] == "pricey")
    assert spend["budget_pct"] <= 100 and spend["spend_month"] == pytest.approx(spend["spend_today"])


async def test_api_spend_per_provider_in_costs_and_the_cli(gw):
    """Issue 14: the costs section and `cetlab costs` carry API spend per provider against its monthly budget."""

    def api(report: dict) -> dict:
        return {p["provider"]: p for p in (report["api"] or {}).get("providers", [])}

    before = api(await gw.client.call("hub", "costs.get", {}))
    assert set(before) == {"cloud", "pricey"} and before["pricey"]["monthly_budget"] == 0.015
    assert (await gw.client.call("node", "costs.get", {}))["api"] is None  # only the gateway's machine pays providers
    status, body, _ = await gw.chat("cloud-big", max_tokens=8)
    assert status == 200, body
    spent = (body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]) * 0.88 / 1e6
    after = api(await gw.client.call("hub", "costs.get", {}))
    assert after["cloud"]["month"] == pytest.approx(before["cloud"]["month"] + spent, abs=1e-8)
    assert after["cloud"]["today"] == pytest.approx(after["cloud"]["month"], abs=1e-8) and after["cloud"]["simulated"]

    async def section_has_it():  # the section every tick carries (the next tick's): the console's :costs reads it
        section = (await gw.client.call("hub", "status"))["costs"]
        return {p["name"]: p["spend_month"] for p in section["api"]}["cloud"] == pytest.approx(after["cloud"]["month"], abs=1e-8)

    await wait_for(section_has_it)
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "console.cli.main", "--lab", str(gw.demo.lab_path), "--json", "costs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lab_costs = json.loads(out.stdout)
    assert {p["provider"] for p in lab_costs["api_providers"]} == {"cloud", "pricey"}
    assert lab_costs["api_month"] == pytest.approx(sum(p["month"] for p in after.values()), abs=1e-6)
    assert lab_costs["total_month"] == pytest.approx(lab_costs["month"] + lab_costs["api_month"], abs=1e-6)
    human = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "console.cli.main", "--lab", str(gw.demo.lab_path), "costs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "API " in human.stdout and "pricey" in human.stdout and "of 0.01 USD" in human.stdout, human.stdout

    async def counters():
        entry = next(m for m in (await gw.client.call("node", "models.list"))["models"] if m["name"] == "meter-me")
        return entry["prompt_tokens_total"], entry["generation_tokens_total"]

    async def counted() -> tuple | None:  # the engine's counters read once
        figures = await counters()
        return figures if figures[0] is not None else None

    before = await wait_for(counted, interval=0.2)
    for i in range(3):
        assert (await gw.chat("meter-me", content=f"count my tokens please {i}", max_tokens=5 + i))[0] == 200
    db = gw.demo.dir / "agents" / "hub" / "state.db"

    def metered():
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute(
                "SELECT COUNT(*), SUM(prompt_tokens), SUM(completion_tokens) FROM gateway_requests "
                "WHERE model='meter-me' AND usage_source='engine'"
            ).fetchone()

    await wait_for(lambda: metered()[0] == 3)

    async def engine_counted() -> tuple | None:  # the engine's own counters have the 18 tokens too
        figures = await counters()
        return figures if figures[1] - before[1] >= 18 else None

    after = await wait_for(engine_counted, timeout=20, interval=0.2)
    _, prompt, completion = metered()
    assert (after[0] - before[0], after[1] - before[1]) == (prompt, completion) == (prompt, 18)


async def test_gateway_role_may_wake_but_not_operate(gw):
    """The gateway's peer key reads and brings models up or down; anything else an operator does is refused."""
    from agents.runtime.peers import PeerClient

    lab = load_lab(gw.demo.lab_path)
    peers = PeerClient(lab, gw.demo.dir / "agents" / "hub", machines=["node"], topics=[])
    await peers.start()
    try:
        await within(peers.links["node"].online.wait(), 20)
        assert (await peers.call("node", "hello"))["role"] == "gateway"
        assert (await peers.call("node", "models.list"))["models"]
        for method, params in (
            ("jobs.start", {"recipe": "x"}),
            ("set_interval", {"interval_s": 5}),
            ("models.pin", {"model": "fast-b"}),
        ):
            with pytest.raises(Exception) as err:
                await peers.call("node", method, params)
            assert getattr(err.value, "code", None) == "forbidden" or "forbidden" in str(err.value), method
    finally:
        await peers.stop()


def test_cli_gateway_json_and_keys(gw_lab):
    def cli(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "console.cli.main", "--lab", str(gw_lab.lab_path), "--json", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    lab = load_lab(gw_lab.lab_path)
    status = cli("gateway")
    assert status["url"] == f"http://127.0.0.1:{lab.gateway.port}/v1"
    assert {"rps", "p95_latency_s", "wakes"} <= set(status["models"][0])
    added = cli("gateway", "keys", "add", "from-cli", "--rpm", "10")
    assert added["key"].startswith("cetlab-gw-") and added["rpm"] == 10
    assert "from-cli" in [k["name"] for k in cli("gateway", "keys", "list")["keys"]]
    assert cli("gateway", "keys", "revoke", "from-cli")["revoked"] is True
    key_file = gw_lab.dir / "console" / "gateway.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


async def test_gateway_view_shows_traffic_and_spend(gw):
    from console.tui.app import CetlabApp
    from console.tui.screens.gateway import GatewayScreen
    from widgets.format import NA
    from widgets.live_table import LiveTable

    assert (await gw.chat("fast-a"))[0] == 200
    app = CetlabApp(load_lab(gw.demo.lab_path), readonly=True)
    async with app.run_test(size=(160, 50)):
        await app.switch_mode("gateway")
        screen = app.screen
        assert isinstance(screen, GatewayScreen)

        def shows_traffic():
            table = screen.query_one("#gateway-table", LiveTable)
            if "local:fast-a" not in table.items or table.row_count == 0:
                return False
            row = table.get_row("local:fast-a")  # p50 latency is unmeasured until a request in the last minute
            return row[7] != NA and "cloud" in str(screen.query_one("#gateway-spend").render())

        await wait_for(shows_traffic, timeout=30)

        await app.switch_mode("costs")  # the API spend, per provider against its budget, beside the energy

        def costs_show_api():
            text = str(app.screen.query_one("#costs-summary").render())
            return "API" in text and "pricey" in text and "of 0.01 USD" in text

        await wait_for(costs_show_api, timeout=30)


async def test_prometheus_series_of_the_gateway(gw_lab, tmp_path):
    """A second gateway agent in this process (any free port), scraped through the agent's own collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from agents.gateway.component import GatewayComponent
    from agents.shell.agent import Agent
    from agents.shell.metrics import AgentCollector
    from agents.wire.catalogue.gateway import KeyAddParams

    lab = load_lab(gw_lab.lab_path)
    lab = lab.model_copy(update={"gateway": lab.gateway.model_copy(update={"port": 0})})
    agent = Agent(lab, "hub", tmp_path / "state", listen=("127.0.0.1", 0), components=lambda core: [GatewayComponent(core)])
    gateway = agent.find(GatewayComponent)
    assert gateway is not None
    await agent.start()
    try:
        token = gateway.keys.add(KeyAddParams(name="scraper"))
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{gateway.http.port}/v1/chat/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"model": "cloud-big", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            ) as r:
                assert r.status == 200
        registry = CollectorRegistry(auto_describe=False)
        registry.register(AgentCollector([agent]))
        text = generate_latest(registry).decode()
        assert 'cetlab_gateway_requests_total{model="cloud-big",tier="provider"} 1.0' in text
        assert 'cetlab_gateway_provider_spend{currency="USD",period="month",provider="cloud"}' in text
        assert 'cetlab_gateway_key_requests_total{key="scraper"} 1.0' in text
    finally:
        await agent.stop()


async def test_peer_client_verifies_host_keys_and_needs_an_authorized_key(gw_lab, tmp_path):
    """No known_hosts entry: untrusted, never trust on first use; the right host keys but a key no agent knows: refused."""
    import shutil

    from agents.runtime.peers import PEER_KNOWN_HOSTS_NAME, PeerClient

    lab = load_lab(gw_lab.lab_path)
    for state_dir, expected in ((tmp_path / "empty", "untrusted"), (tmp_path / "stranger", "refused")):
        state_dir.mkdir(mode=0o700)
        if expected == "refused":
            shutil.copy(gw_lab.dir / "agents" / "hub" / PEER_KNOWN_HOSTS_NAME, state_dir / PEER_KNOWN_HOSTS_NAME)
        peers = PeerClient(lab, state_dir, machines=["node"], topics=[])
        await peers.start()
        try:
            await wait_for(lambda: peers.links["node"].status == expected, timeout=30)
            assert peers.links["node"].writer is None and not peers.links["node"].online.is_set()
        finally:
            await peers.stop()
