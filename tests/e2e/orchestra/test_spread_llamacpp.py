"""One model over two machines with llama.cpp's RPC backend, for real: two agents on loopback with real SSH between them,
the real rpc-server on the helper (irina), the real llama-server on the model's machine (m5), a tiny GGUF written here,
asked through the lab gateway with the openai SDK."""

from __future__ import annotations

import os
import re
import signal
import socket

import asyncssh
import openai
import psutil
import pytest
import yaml

from agents.orchestra.engines.llamacpp import build as llamacpp_build
from agents.orchestra.engines.llamacpp.tiny_gguf import write_tiny_gguf
from agents.runtime.peers import PEER_KEY_NAME
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import SSH_USERNAME
from console.lab.client import FleetClient
from tests.support.rpc_server import rpc_server_or_skip
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


MODEL = "tiny-spread"


@pytest.fixture(scope="module")
def spread_lab(tmp_path_factory):
    rpc_server_or_skip()
    vocab = llamacpp_build.vocab_file()
    assert vocab is not None
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / f"{MODEL}.gguf", vocab, seed=0)
    lab = {
        "lab": "rpc-spread",
        "machines": [{"name": "m5", "gpus": "none"}, {"name": "irina", "gpus": "none"}],
        "models": [
            {
                "name": MODEL,
                "path": str(path),
                "engine": "llamacpp",
                "machine": "m5",
                "rpc": [{"machine": "irina"}],  # irina's rpc-server (its CPU backend here) holds the model's layers
                "load_timeout_s": "120s",
                # -lv 4: llama-server's log says where each buffer lives (its loader's lines)
                "args": ["-c", "512", "-t", "1", "--parallel", "1", "-lv", "4"],
            }
        ],
        "orchestra": {"warm": [MODEL]},
        "gateway": {"machine": "m5"},
    }
    source = tmp_path_factory.mktemp("src") / "lab.yaml"
    source.write_text(yaml.safe_dump(lab, sort_keys=False))
    with DemoLab(tmp_path_factory.mktemp("rpc-spread"), source=source) as demo:
        yield demo


async def model_on_m5(client: FleetClient) -> dict:
    listed = (await client.call("m5", "models.list"))["models"]
    return next(m for m in listed if m["name"] == MODEL)


async def warm(client: FleetClient) -> None:
    async def up() -> bool:
        model = await model_on_m5(client)
        assert model["state"] != "failed", model["error"]
        return model["state"] == "warm"

    await wait_for(up, timeout=180, interval=0.3)


async def rpc_status(client: FleetClient) -> dict:
    return await client.call("irina", "models.rpc_status", {"model": MODEL})


def network_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (where a network neighbour would knock)."""
    return [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


async def outsiders_are_refused(demo: DemoLab, port: int) -> None:
    """rpc-server has no authentication: not on the network, and irina's agent forwards to it for m5's node key only."""
    for address in network_addresses():
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=5).close()
    lab = load_lab(demo.lab_path)
    irina = lab.machine("irina")
    for key in (demo.dir / "console" / "id_ed25519", demo.dir / "agents" / "m5" / PEER_KEY_NAME):  # operator, gateway
        async with asyncssh.connect(
            irina.host,
            irina.port,
            username=SSH_USERNAME,
            client_keys=[str(key)],
            known_hosts=str(demo.dir / "console" / "known_hosts"),
            agent_path=None,
            config=None,
        ) as conn:
            with pytest.raises(asyncssh.ChannelOpenError) as refused:
                await conn.open_connection("127.0.0.1", port)
            assert "may open forwards" in refused.value.reason or "no engine runs" in refused.value.reason


async def test_a_model_spread_over_two_machines_answers_through_the_gateway(spread_lab):
    lab = load_lab(spread_lab.lab_path)
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(20)
        await warm(client)
        model = await model_on_m5(client)
        assert model["helpers"] == ["irina"]

        # irina's rpc-server runs for it, listening on 127.0.0.1 only (rpc-server has no authentication)
        status = await rpc_status(client)
        assert status["state"] == "running" and status["cpu"] is True
        listening = [c.laddr for c in psutil.Process(status["pid"]).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert status["port"] in [addr.port for addr in listening]
        await outsiders_are_refused(spread_lab, status["port"])

        # asked through the gateway with the openai SDK, it answers
        key = (spread_lab.dir / "console" / "gateway.key").read_text().strip()
        async with openai.AsyncOpenAI(base_url=lab.gateway.url, api_key=key, max_retries=0, timeout=120) as sdk:
            reply = await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
            )
        assert reply.choices[0].message.content is not None
        assert reply.usage is not None and reply.usage.completion_tokens > 0

        # llama-server was started with --rpc to a forward on m5's loopback, and used the RPC device for the layers
        log = (spread_lab.dir / "agents" / "m5" / "models" / f"{MODEL}.log").read_text()
        assert "--rpc 127.0.0.1:" in log
        assert re.search(r"RPC0\[127\.0\.0\.1:\d+\] model buffer size = +[1-9]", log), log[-3000:]
        assert re.search(r"RPC0\[127\.0\.0\.1:\d+\] KV buffer size", log)
        helper_log = (spread_lab.dir / "agents" / "irina" / "models" / f"rpc-{MODEL}.log").read_text()
        assert "Accepted client connection" in helper_log, helper_log[-2000:]

        # stopped together: cold on m5 stops irina's rpc-server
        pid = status["pid"]
        await client.call("m5", "models.cold", {"model": MODEL})
        stopped = await rpc_status(client)
        assert stopped["state"] == "stopped" and stopped["pid"] is None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_helper_whose_rpc_server_dies_fails_the_model_naming_it(spread_lab):
    lab = load_lab(spread_lab.lab_path)
    async with FleetClient(lab, subscribe=[]) as client:
        await client.wait_connected(20)
        await client.call("m5", "models.warm", {"model": MODEL})
        await warm(client)
        status = await rpc_status(client)
        os.kill(status["pid"], signal.SIGKILL)

        async def failed() -> dict | None:
            model = await model_on_m5(client)
            return model if model["state"] == "failed" else None

        model = await wait_for(failed, timeout=60, interval=0.3)
        assert "rpc helper irina" in model["error"]["message"], model["error"]
        assert "killed by signal 9" in model["error"]["message"] or "exited" in model["error"]["message"]
        # and the model's own llama-server is stopped with it
        await client.call("m5", "models.cold", {"model": MODEL})
