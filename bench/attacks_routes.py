"""Probes of the gateway's newer routes (issue 31, item 1), run by bench/bench_attacks.py like its others.

E1: /v1/embeddings with a huge `input` list (3,000 texts: over OpenAI's 2,048, refused before anything is held) and
with 2,048 texts of 200 bytes from a key of 50 tokens a day (held at their bound before going upstream: refused, and
nothing charged), again and again for the window.
E2: /v1/rerank with 1,001 documents (over the 1,000 cap) and with 1,000 from the same key (a cross-encoder reads the
query again with each document: the hold counts it so).
E3: the mapped routes' doors: /v1/responses and /v1/messages without a key, with a wrong x-api-key, and a Messages
body asking 10^9 tokens: each status and each error's shape (Anthropic's on /v1/messages)."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from agents.shell.demo.lab import DemoLab
from bench.attacks_quota import QUOTA_KEYS, gateway_url_and_key, key_tokens_today
from bench.probes import probe

MODEL = "cloud-small"  # bench_attacks' LAB sells it
KEY = "tiny50"  # attacks_quota's key of 50 tokens a day


async def _post(session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    async with session.post(url, json=body, headers=headers) as r:
        try:
            return r.status, await r.json(content_type=None)
        except ValueError:
            return r.status, {}


async def _burst(url: str, key: str, seconds: float, cases: dict[str, dict]) -> dict[str, dict[str, int]]:
    codes: dict[str, dict[str, int]] = {label: {} for label in cases}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for label, body in cases.items():
                status, answer = await _post(session, url, body, headers)
                error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
                seen = f"{status} {error.get('param') or error.get('code') or ''}".strip()
                codes[label][seen] = codes[label].get(seen, 0) + 1
    return codes


@probe("E1 a huge input list on /v1/embeddings")
async def e1_huge_embeddings(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    url, key = gateway_url_and_key(demo, name=KEY)
    before = await key_tokens_today(demo, viewer, KEY)
    codes = await _burst(
        f"{url}/embeddings",
        key,
        seconds,
        {
            "3000 inputs": {"model": MODEL, "input": ["x"] * 3000},
            "2048 x 200 bytes": {"model": MODEL, "input": ["y" * 200] * 2048},
        },
    )
    after = await key_tokens_today(demo, viewer, KEY)
    results["e1"] = {"codes": codes, "charged": after - before, "quota": QUOTA_KEYS[KEY]}


@probe("E2 a thousand documents on /v1/rerank")
async def e2_huge_rerank(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    url, key = gateway_url_and_key(demo, name=KEY)
    before = await key_tokens_today(demo, viewer, KEY)
    codes = await _burst(
        f"{url}/rerank",
        key,
        seconds,
        {
            "1001 documents": {"model": MODEL, "query": "q", "documents": ["d"] * 1001},
            "1000 documents": {"model": MODEL, "query": "q" * 100, "documents": ["d"] * 1000},
        },
    )
    after = await key_tokens_today(demo, viewer, KEY)
    results["e2"] = {"codes": codes, "charged": after - before, "quota": QUOTA_KEYS[KEY]}


@probe("E3 the Responses and Messages doors")
async def e3_mapped_doors(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    url, key = gateway_url_and_key(demo)
    messages = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    seen: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for label, path, body, headers in (
            ("responses, no key", "/responses", {"model": MODEL, "input": "hi"}, {}),
            ("messages, no key", "/messages", messages, {}),
            ("messages, wrong x-api-key", "/messages", messages, {"x-api-key": "sk-ant-nope"}),
            ("messages, 10^9 tokens", "/messages", {**messages, "max_tokens": 10**9}, {"x-api-key": key}),
            ("messages, tools", "/messages", {**messages, "tools": [{"name": "t"}]}, {"x-api-key": key}),
            (
                "responses, previous_response_id",
                "/responses",
                {"model": MODEL, "input": "hi", "previous_response_id": "r"},
                {"Authorization": f"Bearer {key}"},
            ),
        ):
            status, answer = await _post(session, url + path, body, headers)
            shape = "anthropic" if answer.get("type") == "error" else "openai" if "error" in answer else "?"
            seen[label] = f"{status} {shape}"
    results["e3"] = seen
