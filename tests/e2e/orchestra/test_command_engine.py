"""engine: command end to end: a real OpenAI-compatible server (the project's simulated vLLM, started from its command
line) warmed through its agent, asked through the gateway over the tunnel, metered from its answer, then colded."""

from __future__ import annotations

import sqlite3
import sys

import aiohttp
import psutil
import pytest

from agents.orchestra.engines import ENGINES
from agents.wire.engine_address import EngineAddress
from agents.wire.lab.model import load_lab, parse_lab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.command_engine import (
    command_lab,
)
from tests.support.engine_sockets import assert_engines_on_sockets
from tests.support.pool import settle
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


def server_processes(where: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "agents.orchestra.engines.vllm.twin" in cmdline and where in cmdline:
            found.append(proc)
    return found


async def test_a_command_model_warms_serves_through_the_gateway_and_colds(lab):
    config = load_lab(lab.lab_path)
    key = (lab.dir / "console" / "gateway.key").read_text().strip()
    async with FleetClient(config, subscribe=[]) as fleet:
        await fleet.wait_connected(20)
        await fleet.call("node", "models.warm", {"model": "any"})
        info = await settle(fleet, "any", ("warm",), timeout=60, machine="node")
        assert info["engine"] == "command" and info["simulated"] is False
        address = EngineAddress.parse(info["endpoint"])
        assert address.socket is not None and server_processes(address.socket)
        assert_engines_on_sockets(lab)  # the placeholders filled in: it listens on its agent's socket only

        # through the gateway on the hub: the tunnel to the node's agent, then the server's /v1 answer
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
            body = {"model": "any", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}
            async with session.post(f"{config.gateway.url}/chat/completions", json=body) as r:
                answer = await r.json()
                assert r.status == 200, answer
                assert r.headers["x-cetlab-target"] == "node" and answer["usage"]["completion_tokens"] == 6

        db = lab.dir / "agents" / "hub" / "state.db"

        def metered() -> tuple[int, int | None]:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                row = conn.execute(
                    "SELECT COUNT(*), SUM(completion_tokens) FROM gateway_requests WHERE model='any' AND usage_source='engine'"
                ).fetchone()
            return row[0], row[1]

        await wait_for(lambda: metered() == (1, 6))  # the tokens its answer reported, metered by the gateway

        # no sleep mode: the agent says so, and a cold stops the server
        with pytest.raises(RemoteError, match="the command engine has no sleep mode; use `cetlab cold any`") as refused:
            await fleet.call("node", "models.sleep", {"model": "any"})
        assert refused.value.code == ErrorCode.UNAVAILABLE
        await fleet.call("node", "models.cold", {"model": "any"})
        await settle(fleet, "any", ("cold", "cached"), timeout=60, machine="node")
        await wait_for(lambda: not server_processes(address.socket), timeout=30)


# a stop command as an operator might write one (`fuser -k PORT/tcp`): it ends whatever listens on the port
STOPPER = """
import sys, psutil
open(sys.argv[1], "w").write(" ".join(sys.argv[2:]))
for proc in psutil.process_iter():
    try:
        if any(c.status == "LISTEN" and c.laddr.port == int(sys.argv[2]) for c in proc.net_connections(kind="inet")):
            proc.terminate()
    except psutil.Error:
        pass
"""


async def test_the_stop_command_stops_the_server(tmp_path, caplog):
    """A real server (Python's http.server) started from its command line; a cold runs the stop command, which ends it."""
    marker = tmp_path / "stopped"
    model = parse_lab(
        command_lab(
            path=str(tmp_path),
            command=[sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", "{model}", "{port}"],
            health_path="/",
            stop_command=[sys.executable, "-c", STOPPER, str(marker), "{port}", "{gpus}"],
        )
    ).models[0]
    engine = ENGINES["command"](model, tmp_path, "node", [0], tmp_path / "server.log")
    await engine.start()
    try:
        await wait_for(engine.health, timeout=30)
    finally:
        await engine.stop()
    assert marker.read_text() == f"{engine.address.port} 0"  # the placeholders filled in, as in the server's own argv
    assert engine.returncode is not None and "did not stop it" not in caplog.text  # no SIGTERM of the group was needed
