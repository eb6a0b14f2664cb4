"""Gateway keys carry limits: the models they may use (names and aliases, fnmatch patterns), an expiry, a money budget
per day or month held through the reservations as provider budgets are. A key refused a model gets OpenAI's 404
naming `model`; an expired key 401; a key past its budget 429 insufficient_quota. The budget holds under concurrent
requests (a property test over random interleavings of holds and settlements)."""

from __future__ import annotations

import json
import tempfile
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agents.gateway.component import GatewayComponent
from agents.gateway.keys import KeyStore
from agents.gateway.lengths import prompt_bound, read_lengths, with_lengths
from agents.gateway.reservation import Reservations
from agents.gateway.target import NotServable, Target
from agents.runtime.store import Store
from agents.wire.catalogue.gateway import KeyAddParams
from agents.wire.lab.gateway import GatewayPolicies, KeyBudget, KeyLimits, Provider, ProviderModel
from agents.wire.lab.model import LabError, parse_lab
from agents.wire.protocol import RemoteError
from tests.support.gateway_upstream import Upstream
from tests.support.waits import wait_for

PRICE = 100.0  # per million tokens: a token costs 0.0001


def test_a_budget_reads_as_written_and_a_bad_one_is_refused_saying_the_form():
    assert KeyBudget.model_validate("5usd/day") == KeyBudget(amount=5, period="day", currency="USD")
    assert KeyBudget.model_validate("20/month") == KeyBudget(amount=20, period="month")
    assert KeyBudget.model_validate(" 7.5 EUR / Month ").currency == "EUR"
    for bad in ("5usd/week", "-1/day", "0/day", "lots/day", "5dollars/day"):
        with pytest.raises(ValidationError) as exc:
            KeyAddParams.model_validate({"name": "k", "budget": bad})
        assert "budget" in str(exc.value), bad


def test_models_match_any_name_of_a_model_by_pattern():
    limits = KeyLimits(models=["llama-*", "tiny"])
    assert limits.allows({"llama-70b"}) and limits.allows({"tiny"}) and limits.allows({"alpha", "llama-8b"})
    assert not limits.allows({"tiny-2"}) and not limits.allows({"mistral"})
    assert KeyLimits().allows({"anything"})  # no models listed: every model
    with pytest.raises(ValidationError):
        KeyLimits(models=["bad name with spaces"])


def test_lab_yaml_keys_section_is_checked_against_the_labs_currency():
    lab = """
lab: k
costs: {currency: EUR}
machines: [{name: box, gpus: none}]
gateway: {machine: box, keys: {alice: {models: ["llama-*"], expires: 2027-01-01, budget: 5/day}}}
"""
    parsed = parse_lab(lab)
    assert parsed.gateway is not None and parsed.gateway.keys["alice"].expires == date(2027, 1, 1)
    with pytest.raises(LabError) as exc:
        parse_lab(lab.replace("budget: 5/day", "budget: 5usd/day"))
    assert "gateway.keys.alice.budget" in str(exc.value) and "EUR" in str(exc.value)


def test_a_key_added_with_limits_keeps_them_across_a_restart_and_lab_yaml_wins(tmp_path):
    store = Store(tmp_path / "a.db")
    keys = KeyStore(store, lambda: "2026-11-26", lambda: "2026-11")
    params = {"name": "team", "models": ["llama-*"], "expires": "2027-01-01", "budget": "5usd/day"}
    keys.add(KeyAddParams.model_validate(params))
    with pytest.raises(RemoteError) as exc:
        keys.add(KeyAddParams.model_validate({**params, "name": "past", "expires": "2020-01-01"}))
    assert "expires" in exc.value.message
    with pytest.raises(RemoteError) as exc:
        keys.add(KeyAddParams.model_validate({**params, "name": "euro", "budget": "5eur/day"}))
    assert "USD" in exc.value.message
    again = KeyStore(Store(tmp_path / "a.db"), lambda: "2026-11-26", lambda: "2026-11")
    (record,) = again.listing()
    assert (record.models, record.expires, record.budget) == (["llama-*"], "2027-01-01", "5 USD/day")
    over = KeyStore(
        Store(tmp_path / "a.db"), lambda: "2026-11-26", configured={"team": KeyLimits(budget=KeyBudget(amount=1, period="month"))}
    )
    (record,) = over.listing()
    assert (record.models, record.expires, record.budget) == ([], None, "1 USD/month")


# ---------------------------------------------------------------------------- the budget under concurrent requests

request = st.fixed_dictionaries(
    {"max_tokens": st.one_of(st.none(), st.integers(1, 400)), "n": st.one_of(st.none(), st.integers(1, 3))}
).map(lambda d: {k: v for k, v in d.items() if v is not None})


# each step: start a request (its body, its prompt's words, its model) or settle one in flight (which one, by index)
step = st.one_of(
    st.tuples(st.just("start"), request, st.integers(0, 60), st.sampled_from(["cheap", "dear"])),
    st.tuples(st.just("settle"), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["day", "month"]), st.floats(0.001, 0.2), st.lists(step, min_size=1, max_size=40))
def test_a_keys_money_budget_is_never_exceeded_by_requests_in_flight_together(period, amount, steps):
    """Requests start and settle in any order; each settles at the most an engine makes of what was sent (every
    choice to its length, the prompt at its bound): what the key spent never passes its budget."""
    models = {
        "cheap": ProviderModel(name="cheap", prompt_per_million=PRICE / 10, completion_per_million=PRICE),
        "dear": ProviderModel(name="dear", prompt_per_million=PRICE * 3, completion_per_million=PRICE * 2),
    }
    provider = Provider(name="cloud", base_url="http://127.0.0.1:9/v1", models=list(models.values()))
    targets = {
        name: Target(name, "provider", provider.base_url, name, "cloud", False, provider=provider, provider_model=m)
        for name, m in models.items()
    }
    with tempfile.TemporaryDirectory() as folder:
        keys = KeyStore(Store(Path(folder) / "k.db"), lambda: "2026-11-26", lambda: "2026-11")
        keys.add(KeyAddParams(name="team", budget=KeyBudget(amount=amount, period=period)))
        (key,) = keys._by_hash.values()
        holds = Reservations(keys, Meter(), GatewayPolicies(max_tokens=4096))  # type: ignore[arg-type]
        in_flight: list[tuple[Any, dict[str, Any], Target]] = []
        for action in steps:
            if action[0] == "start":
                _, fields, words, name = action
                body = {"model": name, "messages": [{"role": "user", "content": "w " * words}], **fields}
                try:
                    prompt = prompt_bound(body)
                    hold = holds.reserve_tokens(key, prompt, read_lengths(body, 4096))
                    holds.reserve_money(hold, targets[name], prompt)
                except NotServable as exc:
                    assert exc.status == 429 and exc.code == "insufficient_quota"
                    continue
                in_flight.append((hold, json.loads(json.dumps(with_lengths(body, hold.figure, targets[name]))), targets[name]))
            elif in_flight:
                hold, sent, target = in_flight.pop(action[1] % len(in_flight))
                model = target.provider_model
                assert model is not None
                completion = max(sent.get("max_tokens") or 0, sent.get("max_completion_tokens") or 0) * (sent.get("n") or 1)
                cost = (prompt_bound(sent) * model.prompt_per_million + completion * model.completion_per_million) / 1e6
                keys.spend(key, cost)
                holds.release(hold)
            assert keys.money_spent(key) <= amount * (1 + 1e-9), (amount, steps)


class Meter:
    def __init__(self) -> None:
        self.spend_month: dict[str, float] = {}


# ---------------------------------------------------------------------------- through the gateway


@pytest.fixture
async def gateway(in_process):
    upstream = Upstream()
    await upstream.start()
    data = {
        "lab": "keys-lab",
        "machines": [{"name": "box", "gpus": "none"}],
        "gateway": {"machine": "box", "port": 0, "keys": {"from-yaml": {"models": ["tiny"]}}},
        "providers": [
            {
                "name": "cloud",
                "base_url": upstream.url,
                "models": [
                    {"name": name, "prompt_per_million": PRICE, "completion_per_million": PRICE}
                    for name in ("llama-8b", "llama-70b", "tiny", "mistral")
                ],
            }
        ],
    }
    lab = await in_process(data)
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    url = await wait_for(lambda: _url(client), 20)
    gateway = lab.agents["box"].find(GatewayComponent)
    assert gateway is not None
    async with aiohttp.ClientSession() as session:
        yield client, session, url, gateway.keys
    await upstream.stop()


async def _url(client) -> str | None:
    status = await client.call("box", "gateway.status")
    return status and status["url"]


async def chat(session: aiohttp.ClientSession, url: str, key: str, model: str, max_tokens: int = 8) -> tuple[int, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}
    async with session.post(f"{url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json(content_type=None)


async def test_a_key_limited_to_some_models_is_refused_the_others_naming_model(gateway):
    client, session, url, _ = gateway
    issued = await client.call("box", "gateway.keys.add", {"name": "team", "models": ["llama-*", "tiny"]})
    key = issued["key"]
    assert issued["models"] == ["llama-*", "tiny"]
    assert (await chat(session, url, key, "llama-70b"))[0] == 200
    assert (await chat(session, url, key, "tiny"))[0] == 200
    assert (await chat(session, url, key, "cloud/tiny"))[0] == 200  # the provider's form of an allowed name
    assert (await chat(session, url, key, "cloud/mistral"))[0] == 404
    status, body = await chat(session, url, key, "mistral")
    error = body["error"]
    assert status == 404 and error["code"] == "model_not_found" and error["param"] == "model" and "team" in error["message"]
    async with session.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}) as r:
        listed = {m["id"] for m in (await r.json())["data"]}
    assert listed == {"llama-8b", "llama-70b", "tiny"}  # it sees only what it may use
    async with session.get(f"{url}/models/mistral", headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 404
    # lab.yaml's gateway.keys entry wins over what the key was given when added
    limited = (await client.call("box", "gateway.keys.add", {"name": "from-yaml", "models": ["mistral"]}))["key"]
    assert (await chat(session, url, limited, "mistral"))[0] == 404 and (await chat(session, url, limited, "tiny"))[0] == 200


async def test_an_expired_key_is_401(gateway):
    client, session, url, keys = gateway
    tomorrow = (date.today() + timedelta(days=2)).isoformat()
    key = (await client.call("box", "gateway.keys.add", {"name": "later", "expires": tomorrow}))["key"]
    assert (await chat(session, url, key, "tiny"))[0] == 200
    keys.configured["later"] = KeyLimits(expires=date.today() - timedelta(days=1))  # as a later lab.yaml says
    status, body = await chat(session, url, key, "tiny")
    assert status == 401 and body["error"]["type"] == "authentication_error" and "expired" in body["error"]["message"]
    listing = {k["name"]: k for k in (await client.call("box", "gateway.keys.list"))["keys"]}
    assert listing["later"]["expired"] is True


async def test_a_key_past_its_money_budget_is_429_insufficient_quota_and_the_views_show_its_use(gateway):
    client, session, url, _ = gateway
    # each request holds its prompt's bound and 50 tokens (0.0001 each) and settles at what the provider counted: the
    # 0.01 budget affords some, then every one after is refused
    key = (await client.call("box", "gateway.keys.add", {"name": "budgeted", "budget": "0.01usd/day"}))["key"]
    statuses = [(await chat(session, url, key, "llama-8b", max_tokens=50))[0] for _ in range(30)]
    assert statuses[0] == 200 and 429 in statuses
    assert set(statuses[statuses.index(429) :]) == {429}, statuses
    status, body = await chat(session, url, key, "llama-8b")
    error = body["error"]
    assert status == 429 and error["type"] == "insufficient_quota" and error["code"] == "insufficient_quota"
    listing = {k["name"]: k for k in (await client.call("box", "gateway.keys.list"))["keys"]}
    assert listing["budgeted"]["budget"] == "0.01 USD/day" and 0 < listing["budgeted"]["spent"] <= 0.01
    section = await client.call("box", "gateway.status")
    use = next(k for k in section["keys"] if k["name"] == "budgeted")
    assert use["budget_amount"] == 0.01 and use["spent"] == listing["budgeted"]["spent"]


async def test_cli_keys_add_with_models_expiry_budget_and_the_gateway_verb_shows_use_against_limits(gateway, capsys):
    from console.cli.gateway import cmd_keys_add
    from console.cli.main import Context, build_parser

    client, _, _, _ = gateway
    lab = client.lab

    async def run(*argv: str) -> str:
        args = build_parser().parse_args(list(argv))
        assert await args.func(Context(args, lab, client)) == 0
        return capsys.readouterr().out

    added = await run(
        "gateway", "keys", "add", "team", "--models", "llama-*, tiny", "--expires", "2027-01-01", "--budget", "5usd/day"
    )
    assert "models: llama-*, tiny" in added and "expires: 2027-01-01" in added and "budget: 5 USD/day" in added
    listed = await run("gateway", "keys", "list")
    assert "0.00 USD of 5 USD/day" in listed and "models llama-*,tiny" in listed and "until 2027-01-01" in listed
    shown = await run("gateway")
    assert "key team" in shown and "of 5 USD/day" in shown
    wrong = build_parser().parse_args(["gateway", "keys", "add", "bad", "--budget", "5usd/week"])
    with pytest.raises(ValidationError) as exc:
        await cmd_keys_add(Context(wrong, lab, client))
    assert "budget" in str(exc.value)


def test_the_gateway_view_says_each_keys_use_against_its_limits():
    from agents.wire.sections.gateway import GatewaySection, KeyUse
    from console.tui.screens.gateway import spend_text

    keys = [
        KeyUse(name="team", models=["llama-*"], budget="5 USD/day", budget_amount=5, spent=5.0, tokens_today=12),
        KeyUse(name="old", expires="2026-01-01", expired=True, rpm=10, requests_last_minute=3),
        KeyUse(name="free"),
    ]
    text = spend_text(GatewaySection(machine="box", keys=keys))
    team, old, free = text.splitlines()
    assert "over budget" in team and "5.00 USD of 5 USD/day" in team and "models llama-*" in team
    assert "expired" in old and "3/10 rpm" in old and "EXPIRED 2026-01-01" in old
    assert "every model" in free and "over budget" not in free
