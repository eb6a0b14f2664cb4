"""Issue 30's classes (items 4 and 5) as probes, run by bench/bench_attacks.py like its others.

C4 sends hostile names (control characters, 10 kB, path separators, markup, unicode look-alikes) in each params field
that names a thing, as raw JSON past the CLI's own checks, with the operator's key (the worst case: a role that may call
every method): how many the agent took past the params check (and so answered from its handler, echoing or keeping
the name), how many of its answers carry a control character raw, and the longest answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import RemoteError
from bench.probes import probe
from console.lab.client import FleetClient

NAMES = {
    "escape": "a\x1b]52;c;cm0gLXJmIH4=\x07",
    "newline": "box\nfake line",
    "10 kB": "a" * 10_240,
    "climb": "a/../../etc",
    "markup": "[bold red]x",
    "bidi": "a\u202eb",
    "look-alike": "\u0430dmin",
}


def _calls(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(method, params) with `name` in each place a name enters."""
    return [
        ("jobs.get", {"id": name}),
        ("jobs.logs", {"id": name}),
        ("jobs.kill", {"id": name}),
        ("jobs.node_status", {"id": name}),
        ("jobs.start", {"recipe": name}),
        ("jobs.start", {"recipe": "train", "params": {name: 1}}),
        ("models.get", {"model": name}),
        ("models.warm", {"model": name}),
        ("models.swap", {"out": name, "in": name}),
        ("checkpoints.list", {"run": name}),
        ("checkpoints.resume", {"run": "r", "step": 1, "params": {name: 1}}),
        ("alerts.ack", {"id": name}),
        ("notify.test", {"route": name}),
        ("gateway.keys.revoke", {"name": name}),
        ("subscribe", {"topics": [name]}),
        ("lab.apply", {"text": "lab: x", "dry_run": True, "peer_keys": {name: {}}}),
    ]


@probe("C4 hostile names at every name field")
async def c4_hostile_names(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """C4: hostile names at every name field of the wire."""
    took, raw, longest, asked = 0, 0, 0, 0
    past: list[str] = []
    async with FleetClient(load_lab(demo.lab_path), subscribe=[], reconnect=False) as client:
        await client.wait_connected(10)
        for kind, name in NAMES.items():
            for method, params in _calls(name):
                asked += 1
                try:
                    answer: str = repr(await client.call("box", method, params, timeout=10))
                    took += 1
                    past.append(f"{method}:{kind}")
                except RemoteError as exc:
                    answer = exc.message
                    if exc.code != "invalid_params":
                        took += 1
                        past.append(f"{method}:{kind}")
                raw += any(c in answer for c in ("\x1b", "\x07", "\u202e", "\n"))
                longest = max(longest, len(answer))
    results["c4"] = {"asked": asked, "past_the_params_check": took, "raw_controls_in_answers": raw, "longest_answer": longest}
    results["c4_past"] = past[:40]
