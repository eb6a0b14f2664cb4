"""Probes of the gateway's quotas (issue 30: R1, R2, R5, R7), run by bench/bench_attacks.py like its others: each an
attacker's function (demo, viewer key, seconds, results) whose figures land in `results`.

R1 and R2 ask the simulated provider through the gateway with keys of a tiny quota (issued by the operator before the
attack: `issue_quota_keys`) and read what the gateway charged; R7 sends orchestra calls whose members are 1 MB names
and reads state.db's size; R5 spends a gateway key's forwards. The gateway's URL and keys for the other probes too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import asyncssh

from agents.runtime.demo import GATEWAY_KEY_FILE
from agents.runtime.waits import within
from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.gateway import GATEWAY_KEYS_ADD, GATEWAY_STATUS, KeyAddParams
from agents.wire.catalogue.method import request
from agents.wire.lab.model import load_lab
from bench.probes import before, probe
from console.lab.client import FleetClient

ATTACKER_GATEWAY_KEY = "mallory.gateway.key"  # in the demo dir: the attacker's own gateway key


QUOTA_KEYS = {"tiny200": 200, "tiny50": 50}  # R1's and R2's keys: name -> tokens per day


def gateway_url_and_key(demo: DemoLab, attacker: bool = False, name: str | None = None) -> tuple[str, str]:
    lab = load_lab(demo.lab_path)
    assert lab.gateway is not None
    path = demo.dir / (f"{name}.gateway.key" if name else ATTACKER_GATEWAY_KEY if attacker else GATEWAY_KEY_FILE)
    return f"http://{lab.gateway.host}:{lab.gateway.port}/v1", path.read_text().strip()


@before
async def issue_quota_keys(demo: DemoLab, client: FleetClient) -> None:
    """R1's and R2's gateway keys, each with its tokens per day (once per lab)."""
    if load_lab(demo.lab_path).gateway is None:
        return
    for name, tokens in QUOTA_KEYS.items():
        if not (demo.dir / f"{name}.gateway.key").exists():
            token = (await request(client, "box", GATEWAY_KEYS_ADD, KeyAddParams(name=name, tokens_per_day=tokens))).key
            (demo.dir / f"{name}.gateway.key").write_text(token + "\n")


async def key_tokens_today(demo: DemoLab, viewer: Path, name: str) -> int:
    """A gateway key's tokens today, as the gateway's section says."""
    async with FleetClient(load_lab(demo.lab_path), key_path=viewer, subscribe=[], reconnect=False) as client:
        await client.wait_connected(20)
        section = (await request(client, "box", GATEWAY_STATUS)).root
    assert section is not None, "the gateway does not run"
    return next(k.tokens_today for k in section.keys if k.name == name)


async def _ask_on_quota(demo: DemoLab, viewer: Path, name: str, model: str, bodies: list[dict]) -> dict:
    url, key = gateway_url_and_key(demo, name=name)
    codes: list[int] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for body in bodies:
            payload = {"model": model, "messages": [{"role": "user", "content": "talk"}], **body}
            async with session.post(f"{url}/chat/completions", json=payload, headers={"Authorization": f"Bearer {key}"}) as r:
                codes.append(r.status)
                await r.read()
    return {"codes": codes, "charged": await key_tokens_today(demo, viewer, name), "quota": QUOTA_KEYS[name]}


def model_of(demo: DemoLab) -> str:
    lab = load_lab(demo.lab_path)
    return lab.providers[0].models[0].name


@probe("R1 n choices on a tiny quota")
async def r1_choices(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R1: a key of 200 tokens a day asks n=32 choices of 200 tokens (before: 6,401 charged)."""
    results["r1"] = await _ask_on_quota(demo, viewer, "tiny200", model_of(demo), [{"n": 32, "max_tokens": 200}] * 2)


@probe("R2 two length fields on a tiny quota")
async def r2_lengths(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R2: a key of 50 tokens a day sends max_completion_tokens 50 and max_tokens 3,000 (before: 3,001 charged)."""
    bodies = [{"max_completion_tokens": 50, "max_tokens": 3000}] * 2
    results["r2"] = await _ask_on_quota(demo, viewer, "tiny50", model_of(demo), bodies)


def _db_bytes(state: Path) -> int:
    """state.db and its write-ahead log: what a write grew."""
    return sum(p.stat().st_size for p in state.glob("state.db*") if p.is_file())


@probe("R7 orchestra member names")
async def r7_member_names(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R7: 20 orchestra calls, each with three members of 1 MB names (before: state.db 1.8 -> 217 MB)."""
    url, key = gateway_url_and_key(demo, attacker=True)
    state = demo.dir / "agents" / "box"
    before = _db_bytes(state)
    codes: dict[int, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for i in range(20):
            models = [f"{c}{i}" * (1024 * 1024 // (len(str(i)) + 1)) for c in "abc"]
            body = {"models": models, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "deadline_s": 5}
            async with session.post(
                f"{url}/orchestra/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                codes[r.status] = codes.get(r.status, 0) + 1
                await r.read()
    await asyncio.sleep(2.0)  # the gateway's meter flushes its request log
    results["r7"] = {"codes": codes, "state_db_mb": (round(before / 2**20, 2), round(_db_bytes(state) / 2**20, 2))}


@probe("R5 the gateway key's forwards")
async def r5_gateway_forwards(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R5: a gateway key (authorized as the lab's gateway machine's would be) opens SSH forwards to the local engine,
    holding each, until one is refused (before: 1,010 forwards filled the 1,024-fd agent, and no login got through)."""

    from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key
    from agents.wire.engine_address import EngineAddress
    from agents.wire.protocol import SSH_USERNAME

    lab = load_lab(demo.lab_path)
    box = lab.machine("box")
    key = ensure_key(demo.dir / "mallory-gateway.key")
    with (demo.dir / "agents" / "box" / AUTHORIZED_KEYS_NAME).open("a") as f:
        f.write(f"gateway {key.export_public_key().decode().strip()}\n")
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(10)
        endpoint = ""
        for _ in range(600):  # the operator warms the lab's model (once), as its gateway would
            listed = (await client.call("box", "models.list"))["models"]
            endpoint = next((m["endpoint"] for m in listed if m["state"] == "warm" and m.get("endpoint")), "")
            if endpoint:
                break
            if listed[0]["state"] in ("cold", "cached"):
                (demo.lab_path.parent / "models" / listed[0]["name"]).mkdir(parents=True, exist_ok=True)  # sim: any folder
                await client.call("box", "models.warm", {"model": listed[0]["name"]})
            await asyncio.sleep(0.1)
    address = EngineAddress.parse(endpoint)  # a unix socket (streamlocal forwards) or a lab.yaml port (direct-tcpip)
    held, refused = [], ""
    known_hosts = str(lab.resolve(lab.console.known_hosts))
    async with asyncssh.connect(
        box.host, box.port, username=SSH_USERNAME, client_keys=[key], known_hosts=known_hosts, agent_path=None, config=None
    ) as conn:
        try:
            for _ in range(1100):
                opening = (
                    conn.open_unix_connection(address.socket)
                    if address.socket is not None
                    else conn.open_connection("127.0.0.1", address.port)
                )
                held.append(await within(opening, 10))
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            refused = str(getattr(exc, "reason", "") or exc or type(exc).__name__)[:160]
        for _, writer in held:
            writer.close()
    results["r5"] = {"forwards_held": len(held), "then": refused}
