"""A helper machine's side of a spread model, with the real rpc-server: started on 127.0.0.1 only, with no GPU lent on a
CPU machine, stopped on request, and its end seen (the model's machine fails the model with it)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from agents.orchestra.spread import RpcServers
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.rpc_server import rpc_server_or_skip
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a real rpc-server: the end-to-end tier


LAB = """\
lab: helper
machines:
  - {name: m5, gpus: none}
  - {name: irina, gpus: none}
models:
  - {name: big, path: /models/big.gguf, engine: llamacpp, machine: m5, rpc: [{machine: irina}]}
  - {name: alone, path: /models/alone.gguf, engine: llamacpp, machine: m5}
"""


def helper_core(state_dir: Path) -> Any:
    """What RpcServers reads of its agent: the lab, this machine, the state dir, the last sample (none here)."""
    lab = parse_lab(LAB, source="lab.yaml")
    return SimpleNamespace(
        lab=lab,
        machine=lab.machine("irina"),
        state_dir=state_dir,
        latest=None,
        claim_gpus=lambda *args: None,
        release_gpus=lambda key: None,
    )


async def test_the_helper_runs_rpc_server_on_loopback_only_and_stops_it(tmp_path):
    rpc_server_or_skip()
    servers = RpcServers(helper_core(tmp_path), placement=None)  # no GPU lent: placement is never asked
    with pytest.raises(RemoteError) as refused:
        await servers.start("alone", 0)
    assert refused.value.code == ErrorCode.NOT_FOUND and servers.ports() == frozenset()
    try:
        status = await servers.start("big", 0)
        assert status.state == "running" and status.cpu and status.pid is not None and status.port is not None
        proc = psutil.Process(status.pid)
        assert proc.cmdline()[1:] == ["--host", "127.0.0.1", "--port", str(status.port)]
        assert proc.environ()["CUDA_VISIBLE_DEVICES"] == ""  # no GPU lent: its CPU backend
        listening = [c.laddr for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", status.port)]
        assert servers.ports() == frozenset({status.port})
        assert (await servers.start("big", 0)).pid == status.pid  # asked again: the same one
        stopped = await servers.stop("big")
        assert stopped.state == "stopped" and stopped.pid is None and servers.ports() == frozenset()
        assert not psutil.pid_exists(status.pid) or proc.status() == psutil.STATUS_ZOMBIE

        again = await servers.start("big", 0)
        assert again.pid is not None
        os.kill(again.pid, signal.SIGKILL)  # the helper's rpc-server dies

        async def ended() -> bool:
            return servers.status(servers.server("big")).state == "failed"

        await wait_for(ended, timeout=30)
        failed = servers.status(servers.server("big"))
        assert failed.error == "rpc-server was killed by signal 9" and failed.port is None
        assert any("cetlab starts rpc-server for big" in line for line in failed.last_lines)
    finally:
        await servers.stop_all()
