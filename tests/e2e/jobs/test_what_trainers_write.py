"""What enters an agent from trainers and files cannot stop it: NaN losses, garbage progress files, colliding run names.

Real agents over real SSH on loopback; a "trainer" here is a real process that writes the document under test
where a trainer writes its progress file, then sleeps like a training run.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import EVENT_TICK, ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.sim_gpu_ticks import SIM_GPU, job_in_section, ticking
from tests.support.waits import wait_for

pytestmark = [pytest.mark.timeout(180)]


# Copies the document named on its command line to the progress file the agent gave it, then trains (sleeps).
WRITER = "import os, shutil, sys, time; shutil.copy(sys.argv[1], os.environ['CETLAB_PROGRESS_FILE']); time.sleep(300)"


def lab_with_writer(tmp_path: Path, document: str, watched: list[Path] = ()) -> dict:
    doc = tmp_path / "progress-under-test.json"
    doc.write_text(document)
    return {
        "lab": "entry-lab",
        "machines": [{"name": "box", "gpus": {"sim": [SIM_GPU]}}],
        "trainers": [
            {
                "name": "writer",
                "machine": "box",
                "gpus": [0],
                "output_dir": str(tmp_path / "out" / "{job_id}"),
                "command": [sys.executable, "-c", WRITER, str(doc)],
                "stop_grace_s": "1s",
            }
        ],
        "checkpoints": {"poll_s": "1s", "dirs": [{"machine": "box", "path": str(p)} for p in watched]},
    }


@contextlib.asynccontextmanager
async def writer_running(tmp_path: Path, lab_file, document: str):
    """A lab whose "trainer" writes `document` as its progress; yields (demo, client, job) and kills the job after."""
    with DemoLab(tmp_path / "run", source=lab_file(lab_with_writer(tmp_path, document))) as demo:
        async with FleetClient(load_lab(demo.lab_path), subscribe=[EVENT_TICK]) as client:
            await client.wait_connected(30)
            job = await client.call("box", "jobs.start", {"recipe": "writer"})
            try:
                yield demo, client, job
            finally:
                await client.call("box", "jobs.kill", {"id": job["id"]})


async def test_a_nan_loss_in_a_progress_file_shows_a_diverged_run_and_the_agent_keeps_ticking(tmp_path, lab_file):
    document = (
        '{"version": 1, "state": "running", "step": 7, "max_steps": 100, "loss": NaN, "epoch": Infinity, "updated_at": 1.0}'
    )
    async with writer_running(tmp_path, lab_file, document) as (_, client, job):
        shown = await wait_for(lambda: (j := job_in_section(client, job["id"])) and j["diverged_at_step"] == 7 and j, timeout=30)
        assert shown["loss"] is None and shown["epoch"] is None and shown["step"] == 7
        alerts = lambda: [a.model_dump(mode="json") for a in client.state.machines["box"].alerts.active if a.rule == "diverged"]  # noqa: E731
        (alert,) = await wait_for(alerts, timeout=15)
        assert alert["job"] == job["id"] and "loss: NaN, diverged at step 7" in alert["message"]
        await ticking(client)
        assert (await client.call("box", "jobs.get", {"id": job["id"]}))["diverged_at_step"] == 7


async def test_a_nan_in_the_newest_checkpoints_trainer_state_is_no_point_of_the_curve(tmp_path, lab_file):
    checkpoint = tmp_path / "elsewhere" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(
        '{"global_step": 2, "log_history": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": NaN}]}'
    )
    document = json.dumps(
        {
            "version": 1,
            "state": "running",
            "step": 2,
            "loss": 2.5,
            "updated_at": 1.0,
            "checkpoints": [{"step": 2, "path": str(checkpoint), "save_s": 0.1, "at": 1.0}],
        }
    )
    async with writer_running(tmp_path, lab_file, document) as (_, client, job):
        shown = await wait_for(lambda: (j := job_in_section(client, job["id"])) and j["diverged_at_step"] == 2 and j, timeout=30)
        assert shown["loss_history"] == [2.5]
        await ticking(client)


async def test_a_garbage_progress_file_is_reported_on_its_job_and_survives_a_restart(tmp_path, lab_file):
    document = '{"version": 1, "state": "running", "step": 3, "checkpoints": 5, "updated_at": 1.0}'
    async with writer_running(tmp_path, lab_file, document) as (demo, client, job):
        shown = await wait_for(lambda: (j := job_in_section(client, job["id"])) and j["progress_problem"] and j, timeout=30)
        assert "progress.json" in shown["progress_problem"] and "checkpoints" in shown["progress_problem"]
        assert isinstance(await client.call("box", "checkpoints.runs"), list)
        await ticking(client)
        demo.stop()  # the agent stops; the job trains on
        demo.launch()
        demo.wait_listening()  # before: the restarted agent died on the recorded progress (TypeError)
        await wait_for(lambda: (j := job_in_section(client, job["id"])) and j["adopted"] and j["progress_problem"], timeout=30)
        await ticking(client)


@pytest.mark.parametrize("layout", ["long names", "a parent named ~~"])
async def test_run_names_that_collide_are_made_unique_and_the_agent_listens_first(tmp_path, lab_file, layout):
    if layout == "long names":  # the same first 64 characters
        folders = [tmp_path / "a" / ("run-" + "x" * 70 + "-one"), tmp_path / "b" / ("run-" + "x" * 70 + "-two")]
    else:  # a suffix from the parent's name that safe names reduce to nothing
        folders = [tmp_path / "a" / "~~" / "exp", tmp_path / "b" / "~~" / "exp", tmp_path / "c" / "~~" / "exp"]
    for folder in folders:
        (folder / "checkpoint-1").mkdir(parents=True)
    with DemoLab(tmp_path / "run", source=lab_file(lab_with_writer(tmp_path, "{}", watched=folders))) as demo:  # listening
        async with FleetClient(load_lab(demo.lab_path), subscribe=[EVENT_TICK]) as client:
            await client.wait_connected(30)
            runs = await client.call("box", "checkpoints.runs")
            names = [r["run"] for r in runs]
            assert len(names) == len(set(names)) == len(folders)
            assert {r["path"] for r in runs} == {str(f.resolve()) for f in folders}
            listed = await client.call("box", "checkpoints.list", {"run": names[-1]})
            assert listed["checkpoints"][0]["step"] == 1
            await ticking(client)


async def test_a_simulated_gpu_cannot_be_driven_to_an_unencodable_figure(tmp_path, lab_file):
    with DemoLab(tmp_path / "run", source=lab_file()) as demo:
        async with FleetClient(load_lab(demo.lab_path), subscribe=[EVENT_TICK]) as client:
            await client.wait_connected(30)
            with pytest.raises(RemoteError) as info:
                await client.call("box", "sim.override", {"gpu": 0, "power_w": 1e308})
            assert info.value.code == ErrorCode.INVALID_PARAMS and "power_w" in info.value.message
            await ticking(client)
