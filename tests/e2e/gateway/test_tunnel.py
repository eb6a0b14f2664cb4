"""Engines never on the network: the gateway reaches another machine's engine over its agent's SSH connection."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat

import aiohttp
import asyncssh
import psutil
import pytest

from agents.runtime.keys import ensure_key
from agents.runtime.peers import PEER_KEY_NAME
from agents.shell.demo.lab import DemoLab
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import load_lab
from agents.wire.protocol import SSH_USERNAME
from console.lab.client import FleetClient
from tests.support.engine_sockets import assert_engines_on_sockets
from tests.support.gateway import gateway_key, running_lab
from tests.support.gateway_tunnel import LAB
from tests.support.pool import engine_http
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tunnel_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, LAB, "tun") as demo:
        yield demo


@pytest.fixture
async def client(tunnel_lab):
    async with FleetClient(load_lab(tunnel_lab.lab_path), subscribe=[]) as fleet:
        await fleet.wait_connected(20)

        async def warm() -> bool:
            listed = [await fleet.call(m, "models.list") for m in ("hub", "node")]
            states = {e["name"]: e["state"] for listing in listed for e in listing["models"]}
            if states.get("spare") in ("cold", "cached"):
                await fleet.call("node", "models.warm", {"model": "spare"})
            return all(states.get(n) == "warm" for n in ("near", "far", "spare"))

        await wait_for(warm, timeout=60, interval=0.2)
        yield fleet


async def engine_socket(fleet: FleetClient, machine: str, name: str) -> str:
    listing = await fleet.call(machine, "models.list")
    socket = EngineAddress.parse(next(e for e in listing["models"] if e["name"] == name)["endpoint"]).socket
    assert socket is not None
    return socket


def agent_pid(demo: DemoLab, machine: str) -> int:
    return next(p.pid for p in demo.processes if "agents.shell.daemon" in p.args and machine in p.args)


async def test_gateway_serves_another_machines_model_through_the_tunnel(tunnel_lab, client):
    lab = load_lab(tunnel_lab.lab_path)
    key = gateway_key(tunnel_lab)
    far = await engine_socket(client, "node", "far")
    # the engine's socket is in a folder of the agent's user only: no other local user reaches it
    assert stat.S_IMODE(os.stat(os.path.dirname(far)).st_mode) == 0o700
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        body = {"model": "far", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with session.post(f"{lab.gateway.url}/chat/completions", json={**body, "stream": True}) as r:
            assert r.status == 200 and b"[DONE]" in await r.read()
        async with session.post(f"{lab.gateway.url}/chat/completions", json=body) as r:  # kept alive after it
            assert r.status == 200, await r.text()
            assert r.headers["x-cetlab-target"] == "node"
        body = {**body, "model": "near"}  # this machine's engine: at its socket, in-process
        async with session.post(f"{lab.gateway.url}/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-cetlab-target"] == "hub"
    # the forward's end on the gateway machine is a unix socket in a folder of the agent's user only: no other local
    # user reaches the remote engine through it (a loopback TCP port would let anyone on the gateway machine in)
    sockets = [
        c.laddr
        for c in psutil.Process(agent_pid(tunnel_lab, "hub")).net_connections(kind="unix")
        if c.laddr and "/node-" in c.laddr and c.laddr.endswith(".sock")
    ]
    assert sockets and all(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700 for path in sockets)


async def test_forwards_only_for_the_gateway_key_and_only_to_running_engines(tunnel_lab, client):
    lab = load_lab(tunnel_lab.lab_path)
    node = lab.machine("node")
    known_hosts = str(tunnel_lab.dir / "console" / "known_hosts")
    gateway_key = ensure_key(tunnel_lab.dir / "agents" / "hub" / PEER_KEY_NAME)
    console_key = ensure_key(tunnel_lab.dir / "console" / "id_ed25519")
    far, spare, near = (
        await engine_socket(client, "node", "far"),
        await engine_socket(client, "node", "spare"),
        await engine_socket(client, "hub", "near"),
    )

    async def forward(key: asyncssh.SSHKey, where: str | tuple[str, int]) -> bytes:
        async with asyncssh.connect(
            node.host, node.port, username=SSH_USERNAME, client_keys=[key], known_hosts=known_hosts, agent_path=None, config=None
        ) as conn:
            if isinstance(where, str):
                reader, writer = await conn.open_unix_connection(where)
            else:
                reader, writer = await conn.open_connection(*where)
            writer.write(b"GET /health HTTP/1.0\r\n\r\n")
            data = await reader.read()
            writer.close()
            return data

    assert (await forward(gateway_key, far)).startswith(b"HTTP/1.")
    refused: list[tuple[asyncssh.SSHKey, str | tuple[str, int]]] = [
        (console_key, far),  # an operator's key: no forwards at all
        (gateway_key, ("127.0.0.1", node.port)),  # the agent's own port
        (gateway_key, near),  # the engine socket of another machine's agent (here on the same host)
        (gateway_key, far.replace("/far.run/", "/far.run/./")),  # by another spelling
        (gateway_key, far.replace("/far.run/", "/spare.run/../far.run/")),
        (gateway_key, str(tunnel_lab.dir / "agents" / "node" / "agent.sock")),  # a socket of the agent's that is no engine
        (gateway_key, "/run/systemd/private"),
    ]
    for key, where in refused:
        with pytest.raises(asyncssh.ChannelOpenError):
            await forward(key, where)
    await client.call("node", "models.cold", {"model": "spare"})
    await wait_for(lambda: _stopped(client, "node", "spare"), timeout=30)
    with pytest.raises(asyncssh.ChannelOpenError):  # its engine has stopped: the socket is no longer one of ours
        await forward(gateway_key, spare)


def _as_nobody(endpoint: str, attempts: list[tuple[str, dict | None]]) -> list[str]:
    """Each request (path, POST body or None) at an engine's endpoint from a forked child running as nobody: its status,
    or the error that stopped it."""
    nobody = pwd.getpwnam("nobody")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no threads used
        outcomes = []
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            for path, body in attempts:
                try:
                    outcomes.append(str(engine_http(endpoint.removesuffix("/v1") + path, body)[0]))
                except OSError as exc:
                    outcomes.append(type(exc).__name__)
        finally:
            os.write(write_fd, json.dumps(outcomes).encode())
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return list(json.loads(data or "[]"))


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another uid needs root (the test forks a child that drops to nobody)")
async def test_another_user_reaches_no_engine_while_the_gateway_and_the_agents_do(tunnel_lab, client):
    """Issue 30, R3: a local user the agent never authorized, at each engine's endpoint as `models.list` names it
    (before: 127.0.0.1:PORT, where it generated unmetered and put models to sleep behind the agent's back)."""
    lab = load_lab(tunnel_lab.lab_path)
    attempts: list[tuple[str, dict | None]] = [
        ("/health", None),
        ("/v1/completions", {"model": "near", "prompt": "free", "max_tokens": 4}),
        ("/sleep?level=1&mode=abort", {}),
    ]
    for machine, name in (("hub", "near"), ("node", "far")):
        listing = await client.call(machine, "models.list")
        endpoint = next(e for e in listing["models"] if e["name"] == name)["endpoint"]
        outcomes = await asyncio.to_thread(_as_nobody, endpoint, attempts)
        assert outcomes == ["PermissionError"] * len(attempts), (name, endpoint, outcomes)
    # the agents still reach them (their health checks keep them warm, awake) and the gateway too: in-process for the
    # hub's own engine, over the SSH link (a direct-streamlocal forward) for the node's
    key = gateway_key(tunnel_lab)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        for name, machine in (("near", "hub"), ("far", "node")):
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            async with session.post(f"{lab.gateway.url}/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-cetlab-target"] == machine
            listing = await client.call(machine, "models.list")
            assert next(e for e in listing["models"] if e["name"] == name)["state"] == "warm"


async def _stopped(client: FleetClient, machine: str, name: str) -> bool:
    listing = await client.call(machine, "models.list")
    return next(e for e in listing["models"] if e["name"] == name)["state"] in ("cold", "cached")


async def test_no_engine_listens_beyond_loopback(tunnel_lab, client):
    listeners = assert_engines_on_sockets(tunnel_lab)
    assert len(listeners) >= 2


async def test_the_gateway_keys_forwards_are_capped_by_the_agents_fds_and_refused_with_a_reason(tunnel_lab, client):
    """R5 (issue 30): 1,010 forwards of the gateway's key filled a 1,024-fd agent and no login got through. Its forwards
    are one principal's, capped at a share of the agent's fd limit (here lowered to 200: 50 forwards); past the cap a
    forward is refused with the reason, and the slots come back when forwards close."""
    from agents.runtime.limits import FORWARD_FD_SHARE

    node = load_lab(tunnel_lab.lab_path).machine("node")
    far = await engine_socket(client, "node", "far")
    agent = psutil.Process(agent_pid(tunnel_lab, "node"))
    known_hosts = str(tunnel_lab.dir / "console" / "known_hosts")
    gateway_key = ensure_key(tunnel_lab.dir / "agents" / "hub" / PEER_KEY_NAME)
    limit = agent.rlimit(psutil.RLIMIT_NOFILE)
    agent.rlimit(psutil.RLIMIT_NOFILE, (200, limit[1]))
    held = []
    try:
        async with asyncssh.connect(
            node.host,
            node.port,
            username=SSH_USERNAME,
            client_keys=[gateway_key],
            known_hosts=known_hosts,
            agent_path=None,
            config=None,
        ) as conn:
            with pytest.raises(asyncssh.ChannelOpenError) as refused:
                for _ in range(200 // FORWARD_FD_SHARE + 10):
                    held.append(await conn.open_unix_connection(far))
            print(f"\n{len(held)} forwards held, the next refused: {refused.value.reason}")
            assert len(held) <= 200 // FORWARD_FD_SHARE  # before: every one, until the agent's fds ran out
            assert "forwards" in refused.value.reason
            assert await client.call("node", "ping") is not None  # the agent still answers its console

            for _, writer in held:
                writer.close()
            held.clear()

            async def opens_again() -> bool:
                try:
                    _, writer = await conn.open_unix_connection(far)
                except asyncssh.ChannelOpenError:
                    return False
                writer.close()
                return True

            await wait_for(opens_again, timeout=20, interval=0.1)
    finally:
        agent.rlimit(psutil.RLIMIT_NOFILE, limit)
