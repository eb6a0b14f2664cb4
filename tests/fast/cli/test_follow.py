"""`cetlab train --follow` says a multi-node job's nodes while they start."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace
from typing import Any

from agents.wire.events import LogEvent
from console.cli import jobs as cli_jobs
from console.cli.jobs import follow
from tests.support.ddp_job import NODES, ddp_job


async def test_follow_says_the_nodes_while_they_start(monkeypatch, capsys):
    """torchrun's imports and rendezvous print nothing for a while: the nodes' states are said when they change."""
    monkeypatch.setattr(cli_jobs, "FOLLOW_POLL_S", 0.01)
    steps = [
        ddp_job(),
        ddp_job(),  # unchanged: said once
        ddp_job(nodes=[{**NODES[0], "state": "running"}, NODES[1]]),
        ddp_job(state="running", nodes=[{**n, "state": "running"} for n in NODES]),
    ]

    class Client:
        on_event: Any = None

        async def call(self, machine: str, method: str, params: Any, timeout: float | None = None) -> Any:
            if method == "jobs.logs":
                return {"id": "m5-2", "path": "log", "lines": [], "offset": 0, "state": "starting"}
            assert method == "jobs.get"
            job = steps.pop(0)
            if not steps:  # the trainer speaks, then ends
                for event in (
                    LogEvent(job="m5-2", lines=["cetlab-train: step 1/4"], offset=1),
                    LogEvent(job="m5-2", offset=2, ended=True, state="exited", exit_code=0),
                ):
                    asyncio.get_running_loop().call_soon(self.on_event, "m5", "log", event)
            return job.to_wire()

    ctx = SimpleNamespace(
        client=Client(),
        args=argparse.Namespace(json=False),
        state=SimpleNamespace(machines={"m5": SimpleNamespace(online=True)}),
    )
    assert await follow(ctx, "m5", "m5-2", 0, offset=0) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line.split(": ", 1)[1] for line in lines if line.startswith("waiting for the nodes")]
    assert said == ["m5 starting, irina starting", "m5 running, irina starting"], lines
    assert lines[-1] == "cetlab-train: step 1/4"
