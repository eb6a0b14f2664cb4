"""What tests/e2e/jobs/test_jobs.py, tests/e2e/jobs/test_multinode.py, tests/e2e/jobs/test_node_start.py,
tests/e2e/jobs/test_on_real_gpus.py share: PY, running, connect, wait_job, ended, cli."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from console.lab.client import FleetClient
from tests.support.lab import kill_jobs_left
from tests.support.waits import wait_for

PY = sys.executable


@contextmanager
def running(demo: DemoLab):
    """The demo's agents while the test runs; afterwards no job of it is left behind, even after a failure."""
    try:
        with demo:
            yield demo
    finally:
        kill_jobs_left(demo.dir)


async def connect(demo: DemoLab, **kwargs) -> FleetClient:
    client = FleetClient(load_lab(demo.lab_path), **kwargs)
    await client.start()
    await client.wait_connected(15)
    assert client.state.machines["box"].online, client.state.machines["box"].error
    return client


async def wait_job(client: FleetClient, job_id: str, predicate, timeout: float = 60.0) -> dict:
    """Poll jobs.get until predicate(job) holds; returns the job."""
    last: dict = {}

    async def met() -> dict | None:
        nonlocal last
        last = await client.call("box", "jobs.get", {"id": job_id})
        return last if predicate(last) else None

    try:
        return await wait_for(met, timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"job {job_id} never met the condition; last seen: {json.dumps(last)[:2000]}") from None


def ended(job: dict) -> bool:
    return job["state"] in ("exited", "failed", "lost")


def cli(demo: DemoLab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "console.cli.main", "--lab", str(demo.lab_path), *args], capture_output=True, text=True, timeout=90
    )
