"""Probes of the chat parameters that become grammars (issue 31, item 1), run by bench/bench_attacks.py like its
others.

T1: hostile tools and schemas at the gateway, for a local model: a schema nested as deep as JSON lets a body be,
a schema nested deeper, 129 tools, markup in a tool's name, a tool_choice naming no tool, a response_format type
nobody serves, and tools with tool_choice auto to a vLLM model started without a parser. Each must be answered
(a 400 naming the param, or the engine's answer), with OpenAI's error shape, and the model must still answer after."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from agents.shell.demo.lab import DemoLab
from bench.attacks_quota import gateway_url_and_key
from bench.probes import probe

MODEL = "local-sim"  # bench_attacks' LAB: a vLLM simulator, warm, without --enable-auto-tool-choice


NESTED = "@nested@"  # stands for the nested schema in a body, written as text (json.dumps cannot nest that deep)


def _nested(depth: int) -> str:
    head = '{"type": "object", "required": ["a"], "properties": {"a": '
    return head * depth + '{"type": "string"}' + "}}" * depth


def _body(body: dict[str, Any], depth: int = 0) -> bytes:
    return json.dumps(body).replace(json.dumps(NESTED), _nested(depth)).encode()


def _tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


@probe("T1 hostile tools and schemas")
async def t1_hostile_tools(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """T1: each hostile body once; the status and param each got, the worst answer time, and the model after."""
    url, key = gateway_url_and_key(demo)
    folder = demo.dir / "models" / MODEL  # the bench lab names a folder nobody writes: the simulator loads any
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(b"\0" * 1024)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases: dict[str, dict[str, Any]] = {
        "schema 240 deep": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": NESTED}}},
        "schema 600 deep": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": NESTED}}},
        "129 tools": {"tools": [_tool(f"f{i}") for i in range(129)], "tool_choice": "required"},
        "markup name": {"tools": [_tool("<script>alert(1)</script>")], "tool_choice": "required"},
        "choice names no tool": {"tools": [_tool("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "format type": {"response_format": {"type": "grammar", "grammar": "root ::= x"}},
        "auto without parser": {"tools": [_tool("f")]},
    }
    answers: dict[str, Any] = {}
    worst_s = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        # the model up first (bench_attacks' LAB warms it at start; its simulated load takes a while)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            wait = {"x-cetlab-max-wait-s": "60"}
            async with session.post(f"{url}/chat/completions", json=base, headers={**headers, **wait}) as r:
                await r.read()
                if r.status == 200:
                    break
        for label, extra in cases.items():
            started = time.monotonic()
            depth = int(label.split()[1]) if label.startswith("schema") else 0
            data = _body({**base, **extra}, depth)
            async with session.post(f"{url}/chat/completions", data=data, headers=headers) as r:
                data = await r.json(content_type=None)
                error = data.get("error") if isinstance(data, dict) else None
                shaped = error is None or set(error) == {"message", "type", "param", "code"}
                said = str(error.get("message"))[:80] if error else None
                answers[label] = (r.status, error.get("param") if error else None, shaped, said)
            worst_s = max(worst_s, time.monotonic() - started)
        async with session.post(f"{url}/chat/completions", json=base, headers=headers) as r:
            after = r.status
    results["t1"] = {"answers": answers, "worst_s": round(worst_s, 3), "model_after": after}


@probe("T2 hostile tools through the fan-out")
async def t2_fanout_tools(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """T2: T1's bodies as an orchestra call of the local model and a provider's: the call takes the checks a single
    request takes (one exchange, agents/gateway/exchange.py): a 400 for the call naming the param, or, where only
    one member's engine cannot take it (tools with auto choice to vLLM without a parser), that member refused naming
    the param and the other answering. Before, the fan-out sent every one of them on."""
    url, key = gateway_url_and_key(demo)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    base = {"models": [MODEL, "cloud-small"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "deadline_s": 30}
    cases: dict[str, dict[str, Any]] = {
        "129 tools": {"tools": [_tool(f"f{i}") for i in range(129)], "tool_choice": "required"},
        "markup name": {"tools": [_tool("<script>alert(1)</script>")], "tool_choice": "required"},
        "choice names no tool": {"tools": [_tool("f")], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "format type": {"response_format": {"type": "grammar", "grammar": "root ::= x"}},
        "temperature": {"temperature": "hot"},
        "auto without parser": {"tools": [_tool("f")]},
    }
    answers: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for label, extra in cases.items():
            async with session.post(f"{url}/orchestra/chat/completions", json={**base, **extra}, headers=headers) as r:
                data = await r.json(content_type=None)
            if r.status != 200 or not isinstance(data, dict) or "results" not in data:
                error = data.get("error") if isinstance(data, dict) else None
                answers[label] = (r.status, error.get("param") if isinstance(error, dict) else None)
            else:  # per member: its status and the param its refusal names
                answers[label] = (r.status, {res["model"]: (res["http_status"], res.get("param")) for res in data["results"]})
    results["t2"] = {"answers": answers}
