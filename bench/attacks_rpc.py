"""The rpc-helper doors (a model spread over several machines with llama.cpp's rpc-server, issue 31 item 5), probed by
bench/bench_attacks.py like its others. rpc-server has no authentication: whoever reaches its port writes and runs
tensors on that machine's GPUs. The agent starts it on 127.0.0.1 only, and only a node key (the spread model's machine)
may ask for one or forward to its port.

X1: the attacker's viewer key asks for an rpc-server (models.rpc_start, _status, _stop) and opens direct-tcpip forwards
to 127.0.0.1 at rpc-server's default port and at the agent's own port: every one must be refused, none started."""

from __future__ import annotations

from pathlib import Path

import asyncssh

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import SSH_USERNAME, RemoteError
from bench.probes import probe
from console.lab.client import FleetClient

RPC_DEFAULT_PORT = 50052  # rpc-server's own default, where a hand-started one would listen
METHODS = ("models.rpc_start", "models.rpc_status", "models.rpc_stop")


@probe("X1 a viewer at the rpc-helper doors")
async def x1_rpc_doors(demo: DemoLab, viewer: Path, seconds: float, results: dict) -> None:
    """X1: each door's answer to the viewer key: the methods' error codes, the forwards' refusals."""
    lab = load_lab(demo.lab_path)
    box = lab.machine("box")
    calls: dict[str, str] = {}
    async with FleetClient(lab, key_path=viewer, subscribe=[], reconnect=False) as client:
        await client.wait_connected(20)
        for method in METHODS:
            try:
                await client.call("box", method, {"model": "local-sim"})
                calls[method] = "answered"
            except RemoteError as exc:
                calls[method] = str(exc.code)
    forwards: dict[str, str] = {}
    async with asyncssh.connect(
        box.host,
        box.port,
        username=SSH_USERNAME,
        client_keys=[str(viewer)],
        known_hosts=str(demo.dir / "console" / "known_hosts"),
        agent_path=None,
        config=None,
    ) as conn:
        for port in (RPC_DEFAULT_PORT, box.port):
            try:
                _reader, writer = await conn.open_connection("127.0.0.1", port)
                writer.close()
                forwards[str(port)] = "opened"
            except asyncssh.ChannelOpenError as exc:
                forwards[str(port)] = f"refused: {exc.reason}"
    results["x1"] = {"calls": calls, "forwards": forwards}
