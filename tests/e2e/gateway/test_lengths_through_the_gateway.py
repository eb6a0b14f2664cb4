"""Hardening IV through the real gateway (issue 30): R1, n choices on a tiny quota; R2, two length fields; R7, orchestra
member names checked as every route's model name. The gateway of tests/e2e/gateway/test_money_and_doors.py (a real agent, real
HTTP on loopback) in front of the provider the test controls, which generates the most any engine would read."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(240)


async def test_n_choices_and_every_length_field_are_held_against_a_tiny_quota(gw):
    r1 = await gw.new_key("r1", tokens_per_day=200)
    for _ in range(2):
        await gw.chat("big", key=r1, n=32, max_tokens=200)
    assert await gw.key_tokens("r1") <= 200  # before: 6,401
    asked = gw.upstream.asked[-1]
    assert asked["n"] == 32 and asked["max_tokens"] * 32 <= 200
    r2 = await gw.new_key("r2", tokens_per_day=50)
    status, body = await gw.chat("big", key=r2, max_completion_tokens=50, max_tokens=3000)
    assert status == 200, body
    asked = gw.upstream.asked[-1]
    assert asked["max_tokens"] == asked["max_completion_tokens"] <= 50  # one figure under both names
    assert await gw.key_tokens("r2") <= 50  # before: 3,001
    status, body = await gw.chat("big", max_tokens=10, n_predict=5000)  # llama-server's own: held, never passed on
    assert status == 400 and body["error"]["param"] == "n_predict"
    status, body = await gw.chat("big", max_tokens=10, min_tokens=20)
    assert status == 400 and body["error"]["param"] == "min_tokens"
    status, body = await gw.chat("big")  # no length: the gateway's own figure goes upstream
    assert status == 200 and gw.upstream.asked[-1]["max_tokens"] == 4096


async def test_orchestra_members_are_model_names_like_any_route(gw):
    rows = len(gw.rows("SELECT * FROM gateway_requests"))
    for members in (["x" * 300_000, "big"], ["big", "\x1b[2J[/b]"], ["big", 7]):
        async with gw.session.post(
            f"{gw.url}/orchestra/chat/completions",
            json={"models": members, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers=gw.headers(),
        ) as r:
            body = await r.json()
        assert r.status == 400 and body["error"]["code"] == "invalid_models", body
        assert "\x1b" not in str(body) and "xxxxxxxx" not in str(body)  # never echoed
    assert len(gw.rows("SELECT * FROM gateway_requests")) == rows  # nothing kept (before: a row per member)
