"""A node start is tied to a job its coordinator started: an id of the coordinator's form, the port it announces, one job
of the recipe at a time (real agents on loopback, the node key's own role, a real torchrun)."""

from __future__ import annotations

import sys

import pytest
import yaml

from agents.jobs.node import RDZV_PORTS
from agents.shell.demo.lab import DemoLab
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.agent_process import connected
from tests.support.jobs import running
from tests.support.multinode import P4

pytestmark = pytest.mark.timeout(180)


WAIT = "import time\ntime.sleep(600)"  # never reached: the rendezvous on a's port has nobody to meet


def lab_data(root, rdzv_port: int | None = None) -> dict:
    recipe = {
        "name": "ddp",
        "nodes": [{"machine": "a", "gpus": [0]}, {"machine": "b", "gpus": [0]}],
        "launcher": "torchrun",
        "nproc_per_node": 1,
        "command": [sys.executable, "-c", WAIT],
        "output_dir": str(root / "runs" / "{job_id}"),
        "stop_grace_s": 5,
    }
    if rdzv_port is not None:
        recipe["rdzv_port"] = rdzv_port
    return {"lab": "nodes", "machines": [{"name": n, "gpus": {"sim": [P4, P4]}} for n in ("a", "b")], "trainers": [recipe]}


def start_lab(root, **kwargs) -> DemoLab:
    source = root / "src"
    source.mkdir(parents=True)
    (source / "lab.yaml").write_text(yaml.safe_dump(lab_data(root, **kwargs), sort_keys=False))
    return DemoLab(root / "run", source=source / "lab.yaml")


async def refused(client, params: dict) -> RemoteError:
    with pytest.raises(RemoteError) as info:
        await client.call("b", "jobs.node_start", {"recipe": "ddp", "node_rank": 1, **params})
    return info.value


async def test_a_node_start_names_a_job_of_its_coordinator_at_the_port_it_announces(tmp_path, with_torchrun):
    with running(start_lab(tmp_path)) as demo:
        client = await connected(demo.lab_path)
        try:
            port = RDZV_PORTS.start
            # not the coordinator's form: another machine's job (its run folder on shared storage), any name
            for job_id in ("b-1", "irina-3", "exp1", "a-0", "a-1x", "aa-1"):
                error = await refused(client, {"id": job_id, "rdzv_port": port})
                assert error.code == ErrorCode.INVALID_PARAMS and "is not one of a's" in error.message, (job_id, error)
            # a port the coordinator never picks: SSH, the gateway, anything else on a's host
            for bad_port in (22, 1024, 8400, RDZV_PORTS.stop, 65535):
                error = await refused(client, {"id": "a-1", "rdzv_port": bad_port})
                assert error.code == ErrorCode.INVALID_PARAMS, (bad_port, error)
            assert not (tmp_path / "runs").exists()  # no folder was made for any of them
            started = await client.call("b", "jobs.node_start", {"id": "a-1", "recipe": "ddp", "node_rank": 1, "rdzv_port": port})
            assert started["state"] in ("starting", "running")
            # one job of the recipe at a time, whatever its id
            error = await refused(client, {"id": "a-2", "rdzv_port": port + 1})
            assert error.code == ErrorCode.CONFLICT and "a-1" in error.message
            error = await refused(client, {"id": "a-1", "rdzv_port": port})
            assert error.code == ErrorCode.CONFLICT
            stopped = await client.call("b", "jobs.node_stop", {"id": "a-1", "kill": True})
            assert stopped["state"] not in ("starting", "running")
        finally:
            await client.stop()


async def test_a_recipes_rdzv_port_is_the_only_one_its_nodes_take(tmp_path, with_torchrun):
    with running(start_lab(tmp_path, rdzv_port=29611)) as demo:
        client = await connected(demo.lab_path)
        try:
            error = await refused(client, {"id": "a-1", "rdzv_port": RDZV_PORTS.start})
            assert error.code == ErrorCode.INVALID_PARAMS and "29611" in error.message
        finally:
            await client.stop()


async def test_the_coordinator_starts_one_job_of_a_recipe_at_a_time_at_an_announced_port(tmp_path, with_torchrun):
    with running(start_lab(tmp_path)) as demo:
        client = await connected(demo.lab_path)
        try:
            job = await client.call("a", "jobs.start", {"recipe": "ddp"})
            assert [n["machine"] for n in job["nodes"]] == ["a", "b"]
            endpoint = next(arg for arg, before in zip(job["argv"][1:], job["argv"]) if before == "--rdzv-endpoint")
            assert int(endpoint.rsplit(":", 1)[1]) in RDZV_PORTS
            with pytest.raises(RemoteError) as info:
                await client.call("a", "jobs.start", {"recipe": "ddp"})
            assert info.value.code == ErrorCode.CONFLICT and "one job of a multi-node recipe at a time" in info.value.message
            await client.call("a", "jobs.kill", {"id": job["id"]})
        finally:
            await client.stop()
