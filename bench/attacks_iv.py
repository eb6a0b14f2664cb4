"""Hardening IV's probes (issue 30: R1, R2, R4, R7, R8, R9 and on), run by bench/bench_attacks.py like its others:
each an attacker's function (demo, viewer key, seconds, results) whose figures land in `results`.

R1 and R2 ask the simulated provider through the gateway with keys of a tiny quota (issued by the operator before the
attack: `issue_quota_keys`) and read what the gateway charged; R7 sends orchestra calls whose members are 1 MB names
and reads state.db's size; R8 runs the CLI's logging (as `cetlab` sets it up) over an agent's hostile error text and
counts the control bytes that reach its stderr; R9 opens `:costs` headless on a report whose day is markup; R4 asks the
GPU support check's reader (as the agent's event loop does) about a trainer Python that never answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
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
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J[/b][bold red]EVIL[/]\x9b31m"


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


CLI_LOG = """
import logging, sys
from console.cli import main as cli
try:
    cli.main(["--help"])  # the CLI sets its logging up before it reads its arguments
except SystemExit:
    pass
logging.getLogger("cetlab.link").warning("%s: %s", "box", sys.argv[1])
"""


@probe("R8 agent text in the CLI's log")
async def r8_cli_log(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R8: an agent's error text logged by the CLI (an unanswered error reply): the control bytes on its stderr."""
    done = subprocess.run([sys.executable, "-c", CLI_LOG, HOSTILE], capture_output=True, timeout=60, check=False)
    controls = sum(done.stderr.count(c) for c in (b"\x1b", b"\x07", b"\xc2\x9b"))
    results["r8"] = {"control_bytes_on_stderr": controls, "stderr_bytes": len(done.stderr)}


@probe("R9 markup in costs' day")
async def r9_costs_day(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R9: a costs reply whose since.day is markup, through the console's summing and its `:costs` view (headless)."""
    from console.lab.costs import lab_costs
    from console.lab.state import LabState
    from console.tui.app import CetlabApp
    from console.tui.screens.costs import CostsScreen

    lab = load_lab(demo.lab_path)
    reply = {"machine": "box", "currency": "EUR", "timezone": "UTC", "since": {"day": "[/b]" + HOSTILE, "cost": 1.0}}
    report = lab_costs("EUR", {"box": reply})
    crashed: str | None = None
    if report.offline:  # refused where it entered: the view is shown an old-agent report with the same string
        report = report.model_copy(update={"since": "[/b]" + HOSTILE, "offline": {}})
    state = LabState(lab)
    app = CetlabApp(lab, client=FleetClient(lab, state), connect=False)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await app.switch_mode("costs")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, CostsScreen)
            screen.report = report
            screen.refresh_data()
            await pilot.pause()
    except Exception as exc:  # what every console that opened it did
        crashed = f"{type(exc).__name__}: {str(exc)[:80]}"
    results["r9"] = {"refused_on_the_wire": bool(lab_costs("EUR", {"box": reply}).offline), "view_crashed": crashed}


@probe("R4 a trainer Python that never answers")
async def r4_hanging_trainer_python(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R4: a trainer "python" whose torch probe waits on a FIFO nobody writes: how long the event loop's ask held the
    loop, and what the stack says once the probe's timeout has passed."""
    from agents.runtime.torch_probe import TorchReader

    with tempfile.TemporaryDirectory() as folder:
        fifo = Path(folder) / "never-written"
        os.mkfifo(fifo)
        python = Path(folder) / "python"
        python.write_text(f"#!/bin/sh\nread line < {fifo}\n")
        python.chmod(0o755)
        reader = TorchReader(timeout_s=3)
        started = time.monotonic()
        first = reader.peeking().stack(str(python))
        held = time.monotonic() - started
        after = await asyncio.to_thread(reader.stack, str(python))
    results["r4"] = {"loop_held_s": round(held, 3), "at_once": first.problem, "after_timeout": after.problem}


@probe("S2 idle_watts 1e300 in lab.yaml")
async def s2_huge_watts(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """Issue 30's small one: the demo's lab.yaml with a machine's idle_watts 1e300: refused, or the figure it loads."""
    import yaml

    from agents.wire.lab.model import LabError, parse_lab

    raw = yaml.safe_load(demo.lab_path.read_text())
    raw["machines"][0]["idle_watts"] = 1e300
    try:
        loaded: object = parse_lab(yaml.safe_dump(raw)).machines[0].idle_watts
    except LabError as exc:
        loaded = f"refused: {exc.problems[0][:120]}"
    results["s2"] = {"idle_watts_1e300": loaded}


@probe("S1 --tail 10000 of a 10 MB log")
async def s1_tail_of_10mb(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """Issue 30's small one: `--tail 10000` of a 10 MB log (1 kB lines): the lines that come back and whether it says cut."""
    from agents.jobs.logs import tail

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "job.log"
        log.write_text("".join(f"{i:06d} {'x' * 1016}\n" for i in range(10_000)))
        found = tail(log, 10_000)
    results["s1"] = {"asked": 10_000, "lines": len(found.lines), "says_cut": found.cut}


@probe("R10 version-line storm", logins=True)
async def r10_version_storm(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R10: new connections to the SSH port from the console's own address, each sending an SSH version line and
    nothing more (no key needed), as fast as they open; each held until the agent closes it or 900 newer are open."""
    await connection_storm(demo, seconds, results, b"SSH-2.0-OpenSSH_9.6\r\n")


async def connection_storm(demo: DemoLab, seconds: float, results: dict, greeting: bytes = b"") -> None:
    """New TCP connections to the agent's SSH port from 127.0.0.1, as fast as they open (about 2,000 a second at
    most), each sending ``greeting`` (nothing: idle) and held until the agent closes it or 900 newer are open."""
    import resource
    import socket

    port = load_lab(demo.lab_path).machine("box").port
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held: list[socket.socket] = []
    opened = 0
    loop = asyncio.get_running_loop()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            s = socket.socket()
            s.setblocking(False)
            try:
                await within(loop.sock_connect(s, ("127.0.0.1", port)), 1)
                if greeting:
                    s.send(greeting)
            except (TimeoutError, OSError):
                s.close()
                continue
            opened += 1
            held.append(s)
            if len(held) > 900:
                held.pop(0).close()
            if opened % 20 == 0:
                await asyncio.sleep(0.01)  # ~2,000 a second at most
    finally:
        for s in held:
            s.close()
    results["storm_opened"] = opened
    results["storm_rate_per_s"] = round(opened / seconds)


@probe("R6 100 socket connections of one uid")
async def r6_socket_connections(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R6: one local user with 100 connections to the agent's unix socket, each sending pings as fast as they are
    answered (the socket applied no per-principal caps: 12,238 answers/s, a console's ping p50 1.3 s)."""
    path = demo.dir / "agents" / "box" / "agent.sock"
    ping = b'{"id": 1, "method": "ping"}\n' * 50
    codes: dict[str, int] = {}
    end = time.monotonic() + seconds

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
        except OSError as exc:
            codes[f"connect: {exc.strerror}"] = codes.get(f"connect: {exc.strerror}", 0) + 1
            return
        try:
            while time.monotonic() < end:
                writer.write(ping)
                for _ in range(50):
                    line = await reader.readline()
                    if not line:
                        codes["closed"] = codes.get("closed", 0) + 1
                        return
                    code = str(json.loads(line).get("error", {}).get("code", "ok"))
                    codes[code] = codes.get(code, 0) + 1
                    if code != "ok" and "open to this agent" in json.loads(line)["error"]["message"]:
                        return  # refused at the door
        except (ConnectionError, ValueError):
            codes["closed"] = codes.get("closed", 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(100)))
    results["r6"] = {"answers_per_s": round(codes.get("ok", 0) / seconds), **codes}


@probe("R5 the gateway key's forwards")
async def r5_gateway_forwards(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R5: a gateway key (authorized as the lab's gateway machine's would be) opens SSH forwards to the local engine,
    holding each, until one is refused (before: 1,010 forwards filled the 1,024-fd agent, and no login got through)."""
    import asyncssh

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


@probe("R12 a refusing endpoint and a flapping alert")
async def r12_notifications(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """R12: the lab's pager refuses GPU 0's notifications (retried in an hour); GPU 1 then fires: whether its firing is
    delivered; then GPU 1 flaps 10 times: the rows its flapping added to the outbox (before: 2 per flap)."""
    import sqlite3

    db = sqlite3.connect(f"file:{demo.dir / 'agents' / 'box' / 'state.db'}?mode=ro", uri=True)

    def rows(where: str = "1") -> int:
        return int(db.execute(f"SELECT COUNT(*) FROM notify_outbox WHERE {where}").fetchone()[0])

    async with FleetClient(load_lab(demo.lab_path), subscribe=[]) as client:
        await client.wait_connected(10)

        async def firing(gpu: int) -> bool:
            alerts = (await client.call("box", "alerts.list", {"active": True}))["alerts"]
            return any(a["gpu"] == gpu and a["rule"] == "gpu_hot" for a in alerts)

        async def until(gpu: int, hot: bool) -> None:
            for _ in range(100):
                if await firing(gpu) == hot:
                    return
                await asyncio.sleep(0.1)

        async def set_temp(gpu: int, temp: float) -> None:
            await client.call("box", "sim.override", {"gpu": gpu, "temp_c": temp})
            await until(gpu, temp > 85)

        await set_temp(0, 95.0)
        await set_temp(1, 95.0)
        started, delivered_s = time.monotonic(), None
        while time.monotonic() - started < 10:
            if rows("key LIKE '%:firing' AND notification LIKE '%\"gpu\":1,%' AND delivered_at IS NOT NULL"):
                delivered_s = round(time.monotonic() - started, 1)
                break
            await asyncio.sleep(0.1)
        await set_temp(1, 40.0)
        before = rows()
        for _ in range(10):
            await set_temp(1, 95.0)
            await set_temp(1, 40.0)
        results["r12"] = {"gpu1_firing_delivered_after_s": delivered_s, "outbox_rows_for_10_flaps": rows() - before}
        await client.call("box", "sim.override", {"gpu": 0, "temp_c": 40.0})


async def open_channel(demo: DemoLab, key: Path) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHWriter, asyncssh.SSHReader]:
    lab = load_lab(demo.lab_path)
    m = lab.machine("box")
    conn = await asyncssh.connect(
        m.host,
        m.port,
        username="cetlab",
        client_keys=[str(key)],
        known_hosts=str(lab.resolve(lab.console.known_hosts)),
        agent_path=None,
        config=None,
    )
    writer, reader, _ = await conn.open_session(subsystem="cetlab", encoding=None)
    return conn, writer, reader
