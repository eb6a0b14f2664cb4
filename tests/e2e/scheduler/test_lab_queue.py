"""The lab queue end to end: real agents over SSH on loopback, the queue's keeper on one machine starting jobs on
another with the scheduler key the demo authorizes, real trainer processes (a script that waits for a file).

`cetlab train` on a busy GPU queues and says why, starts when the GPU frees; a recipe by need lands on the other
machine's GPU that fits; the keeper's agent killed and restarted mid-queue loses nothing and starts nothing twice."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.protocol import ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.jobs import PY, cli, running
from tests.support.lab import REPO, run_agent
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(300)

WAITER = "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists():\n    time.sleep(0.05)\n"
P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}
P40 = {"name": "Tesla P40", "memory_gib": 24, "tdp_w": 250}


def lab_data(release: Path) -> dict:
    waiter = [PY, "-c", WAITER, str(release / "{job_id}")]
    return {
        "lab": "queue-e2e",
        "machines": [{"name": "hub", "gpus": {"sim": [P4]}}, {"name": "node", "gpus": {"sim": [P40]}}],
        "scheduler": {"machine": "hub", "interval_s": 0.2},
        "trainers": [
            {"name": "first", "machine": "node", "gpus": [0], "command": waiter, "output_dir": "runs/{job_id}"},
            {"name": "second", "machine": "node", "gpus": [0], "command": waiter, "output_dir": "runs/{job_id}"},
            # only node's P40 has 16 GiB: asked from hub, it runs there
            {
                "name": "big",
                "machine": "hub",
                "need": {"gpus": 1, "min_vram_gib": 16},
                "command": waiter,
                "output_dir": "runs/{job_id}",
            },
        ],
    }


def make_lab(root: Path) -> DemoLab:
    source = root / "src"
    source.mkdir(parents=True)
    shutil.copytree(REPO / "demo", source / "demo")
    (root / "release").mkdir()
    (source / "lab.yaml").write_text(yaml.safe_dump(lab_data(root / "release"), sort_keys=False))
    return DemoLab(root / "run", source=source / "lab.yaml")


def release(root: Path, job_id: str) -> None:
    (root / "release" / job_id).write_text("go")


async def connect(demo: DemoLab) -> FleetClient:
    from agents.wire.lab.model import load_lab

    client = FleetClient(load_lab(demo.lab_path), subscribe=[])
    await client.start()
    await client.wait_connected(20)
    return client


async def entry(client: FleetClient, entry_id: int) -> dict:
    return next(e for e in await client.call("hub", "queue.list", {}) if e["id"] == entry_id)


async def test_a_busy_gpu_queues_says_why_and_starts_when_it_frees(tmp_path):
    with running(make_lab(tmp_path)) as demo:
        client = await connect(demo)
        try:
            submitted = await client.call("hub", "queue.submit", {"recipe": "first"})
            first = await wait_for(lambda: _started(client, submitted["id"]), timeout=30)  # once its link to node is up
            assert first["machine"] == "node" and first["gpus"] == [0], first
            job = await client.call("node", "jobs.get", {"id": first["job_id"]})
            assert job["queued_as"] == f"hub:{first['id']}" and job["user"] == "demo-console"
            await wait_for(lambda: client.state.machines["node"].online, timeout=10)

            said = cli(demo, "train", "second")  # what a person types: queued, and why, in words
            assert said.returncode == 0, said.stderr
            assert said.stdout.startswith("queued: entry 2 (second, demo-console): 1st in line: waiting for GPU 0 of node: ")
            assert f"node GPU 0 runs job {first['job_id']} (first)" in said.stdout
            listed = cli(demo, "--json", "queue")
            assert [e["state"] for e in yaml.safe_load(listed.stdout)["queue"]] == ["running", "queued"]

            release(tmp_path, first["job_id"])
            freed = time.monotonic()
            second = await wait_for(lambda: _started(client, 2), timeout=60, interval=0.05)
            took = time.monotonic() - freed
            done = await entry(client, first["id"])
            assert done["state"] == "ended" and done["job_state"] == "exited"
            assert second["machine"] == "node" and second["gpus"] == [0] and second["job_id"] != first["job_id"]
            print(f"\nGPU freed -> next job started: {took:.2f} s (the trainer's exit, the node's tick, the queue's pass)")
            release(tmp_path, second["job_id"])
        finally:
            await client.stop()


async def _started(client: FleetClient, entry_id: int) -> dict | None:
    found = await entry(client, entry_id)
    return found if found["state"] == "running" and found["job_id"] else None


async def test_a_recipe_by_need_lands_on_the_machine_whose_gpu_fits(tmp_path):
    with running(make_lab(tmp_path)) as demo:
        client = await connect(demo)
        try:
            submitted = await client.call("hub", "queue.submit", {"recipe": "big"})
            big = await wait_for(lambda: _started(client, submitted["id"]), timeout=30)
            assert (big["machine"], big["gpus"]) == ("node", [0]), big
            job = await client.call("node", "jobs.get", {"id": big["job_id"]})
            assert job["gpus"] == [0] and job["recipe"] == "big"
            # asked again while the P40 is taken: it waits, naming what holds it and the machine that cannot fit
            again = await client.call("hub", "queue.submit", {"recipe": "big"})
            assert again["state"] == "queued"
            assert again["reason"].startswith(  # "(big)", or "(big, starting)" while no tick of node shows it yet
                f"waiting for 1 GPU >= 16 GiB: hub has 0 GPUs that fit (GPU 0 (Tesla P4) has 8 GiB, under 16 GiB); "
                f"node GPU 0 runs job {big['job_id']} (big"
            )
            await client.call("hub", "queue.cancel", {"id": again["id"]})
            release(tmp_path, big["job_id"])
        finally:
            await client.stop()


async def test_the_keepers_restart_mid_queue_loses_nothing_and_starts_nothing_twice(tmp_path):
    with running(make_lab(tmp_path)) as demo:
        client = await connect(demo)
        try:
            submitted = await client.call("hub", "queue.submit", {"recipe": "first"})
            first = await wait_for(lambda: _started(client, submitted["id"]), timeout=30)
            second = await client.call("hub", "queue.submit", {"recipe": "second"})
            assert second["state"] == "queued"
            hub = demo.agent_process("hub")
            hub.kill()  # kill -9: no chance to write anything more
            hub.wait()
            await wait_for(lambda: not client.state.machines["hub"].online, timeout=20)
            release(tmp_path, first["job_id"])  # the GPU frees while nobody keeps the queue
            demo.replace_agent("hub", run_agent(demo.lab_path, "hub", demo.dir / "agents" / "hub"))
            await wait_for(lambda: client.state.machines["hub"].online, timeout=40)
            started = await wait_for(lambda: _started(client, second["id"]), timeout=60)
            assert (await entry(client, first["id"]))["job_state"] == "exited"
            jobs = await client.call("node", "jobs.list", {})
            assert sorted(j["queued_as"] for j in jobs) == [f"hub:{first['id']}", f"hub:{second['id']}"]  # each once
            release(tmp_path, started["job_id"])
        finally:
            await client.stop()


SIM = {"load_s": 0.05, "cold_factor": 1, "warmup_s": 0.05, "wake_s": 0.05, "tokens_per_s": 0, "placeholder_mib": 1}


def yielding_lab(root: Path) -> DemoLab:
    data = lab_data(root / "release")
    data["models"] = [
        {"name": "solo", "path": "models/solo", "engine": "sim", "machine": "node", "gpus": [0], "vram_gib": 1, "sim": SIM}
    ]
    data["orchestra"] = {"warm": ["solo"], "yields": ["solo"]}
    source = root / "src"
    source.mkdir(parents=True)
    shutil.copytree(REPO / "demo", source / "demo")
    (root / "release").mkdir()
    (source / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return DemoLab(root / "run", source=source / "lab.yaml")


async def _model_state(client: FleetClient, name: str) -> str:
    return (await client.call("node", "models.get", {"model": name}))["state"]


async def test_a_model_gives_its_gpu_to_a_job_and_comes_back_after_it(tmp_path):
    with running(yielding_lab(tmp_path)) as demo:
        client = await connect(demo)
        try:
            await wait_for(lambda: _is(client, "solo", "warm"), timeout=60)
            submitted = await client.call("hub", "queue.submit", {"recipe": "first"})
            started = await wait_for(lambda: _started(client, submitted["id"]), timeout=60)
            assert started["yielded"] == ["solo"] and started["gpus"] == [0]
            assert await _model_state(client, "solo") == "sleeping"  # its GPU is the job's now
            with pytest.raises(RemoteError) as refused:  # nobody brings it up on the job's GPU meanwhile: not by hand either
                await client.call("node", "models.warm", {"model": "solo"})
            assert refused.value.code == ErrorCode.CONFLICT
            assert f"runs job {started['job_id']} (first)" in refused.value.message
            release(tmp_path, started["job_id"])
            back = await wait_for(lambda: _restored(client, submitted["id"]), timeout=60)
            assert back["job_state"] == "exited"
            await wait_for(lambda: _is(client, "solo", "warm"), timeout=60)  # as it was before the job
        finally:
            await client.stop()


async def _is(client: FleetClient, model: str, state: str) -> bool:
    return await _model_state(client, model) == state


async def _restored(client: FleetClient, entry_id: int) -> dict | None:
    found = await entry(client, entry_id)
    return found if found["state"] == "ended" and found["restored"] else None
