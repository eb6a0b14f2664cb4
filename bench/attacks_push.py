"""Probes of `lab.apply` (issue 29's `cetlab lab push`), run by bench/bench_attacks.py like its others: each an
attacker's function (demo, viewer key, seconds, results) whose figures land in `results`.

L1: a viewer sends lab.apply with a lab.yaml of the largest size the method takes, as fast as its budget lets it: every
call refused (forbidden), the agent's lab.yaml unchanged. L2: an operator (the demo console's key) pushes hostile
texts: an alias bomb, deep nesting, a key given twice, a lab without its machine, a pushed key with the operator role
asked for: each refused with lab.yaml:LINE:COL (or ignored), the agent's lab.yaml version unchanged, and how long each
refusal took (the validation runs off the agent's loop: the console's pings during it are the harness's figures)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import asyncssh

from agents.runtime.keys import PUSHED_AUTHORIZED_KEYS_NAME
from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.lab import LabApplyParams
from agents.wire.lab.yaml_doc import MAX_BYTES
from bench.attacks_connections import open_channel
from bench.probes import probe

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(12)
)


async def _call(writer: asyncssh.SSHWriter, reader: asyncssh.SSHReader, n: int, method: str, params: dict) -> dict:
    writer.write(json.dumps({"id": n, "method": method, "params": params}).encode() + b"\n")
    while True:
        reply = json.loads(await reader.readline())
        if reply.get("id") == n:
            return reply


@probe("L1 a viewer pushes a lab.yaml")
async def l1_viewer_pushes(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """L1: a viewer's lab.apply of a maximal text, again and again (each line ~0.5 MB)."""
    text = "# " + "x" * (MAX_BYTES // 2) + "\n" + demo.lab_path.read_text()
    conn, writer, reader = await open_channel(demo, viewer)
    codes: dict[str, int] = {}
    try:
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            n += 1
            try:
                reply = await within(_call(writer, reader, n, "lab.apply", {"text": text}), 10)
            except TimeoutError:
                reply = {"error": {"code": "no answer in 10 s"}}
            code = reply.get("error", {}).get("code", "ok")
            codes[code] = codes.get(code, 0) + 1
        version = (await within(_call(writer, reader, n + 1, "hello", {}), 30))["result"].get("lab_version")
    finally:
        conn.abort()
    results["l1"] = {"codes": codes, "lab_version_after": version}


@probe("L2 hostile lab.yaml texts pushed")
async def l2_hostile_texts(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """L2: an operator pushes hostile texts; each refusal, its time, and the version after."""
    base = demo.lab_path.read_text()
    texts = {
        "alias bomb": BOMB + base,
        "deep nesting": "x: " + "[" * 200 + "]" * 200 + "\n" + base,
        "key twice": base + "lab: again\n",
        "no machine box": "lab: other\nmachines: [{name: elsewhere, gpus: none}]\n",
    }
    conn, writer, reader = await open_channel(demo, demo.dir / "console" / "id_ed25519")
    said: dict[str, dict] = {}
    try:
        before = (await _call(writer, reader, 1, "hello", {}))["result"].get("lab_version")
        for n, (name, text) in enumerate(texts.items(), 2):
            started = time.perf_counter()
            reply = await _call(writer, reader, n, "lab.apply", LabApplyParams(text=text).model_dump(mode="json"))
            error = reply.get("error", {})
            said[name] = {
                "code": error.get("code", "ok"),
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "first_line": (error.get("message") or "").splitlines()[1:2],
            }
        # a push asking for more than the gateway and node roles: the agent decides the roles, never the caller
        key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
        params = {"text": base, "peer_keys": {"box": {"peer": key, "node": key}}, "dry_run": True}
        reply = await _call(writer, reader, 99, "lab.apply", params)
        said["keys of its own machine"] = {"authorized": reply.get("result", {}).get("authorized")}
        after = (await _call(writer, reader, 100, "hello", {}))["result"].get("lab_version")
    finally:
        conn.abort()
    pushed = demo.dir / "agents" / "box" / PUSHED_AUTHORIZED_KEYS_NAME
    results["l2"] = {
        "refusals": said,
        "version_unchanged": before == after,
        "pushed_operator_lines": pushed.read_text().count("operator") if pushed.exists() else 0,
    }
