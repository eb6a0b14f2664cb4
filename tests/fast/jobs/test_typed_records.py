"""The jobs' records typed end to end (a job's progress and nodes, a node's status), the secondary states as Literals that
match what produces them, and the jobs reached through their port."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from agents.jobs.component import JobsComponent
from agents.jobs.job import Job
from agents.jobs.port import JobsPort, JobView
from agents.jobs.progress import update_progress
from agents.orchestra.engines import ENGINES
from agents.runtime.store import Store
from agents.shell.agent import Agent
from agents.telemetry.nvml import NvmlSampler
from agents.telemetry.samplers import _NoGpus
from agents.telemetry.sim import SimSampler
from agents.train import precision as train_precision
from agents.train.progress import STATES, write_progress
from agents.wire.lab.model import Model, parse_lab
from agents.wire.protocol import GpuBackend, RemoteError
from agents.wire.schema import EngineName
from agents.wire.sections.base import Precision, ProgressState
from agents.wire.sections.checkpoints import CheckpointInfo
from agents.wire.sections.jobs import NODE_ERROR_CHARS, JobDetail, JobInfo, JobNode, JobProgress, NodeStatus
from agents.wire.sections.models import ModelInfo
from agents.wire.states import JobState
from tests.support.waits import wait_for

PY = sys.executable


# ---------------------------------------------------------------------------- secondary states


def test_each_secondary_state_is_exactly_what_its_producer_writes():
    assert typing.get_args(ProgressState) == STATES  # the trainer's progress protocol refuses any other state
    assert set(typing.get_args(Precision)) == set(typing.get_args(train_precision.Precision))
    # engine names: the registry's, each a valid wire EngineName (the wire carries a constrained string, no copy of the list)
    assert all(TypeAdapter(EngineName).validate_python(name) == name for name in ENGINES)
    assert Model.model_fields["engine"].annotation is str and ModelInfo.model_fields["engine"].annotation is str
    assert set(typing.get_args(GpuBackend)) == {NvmlSampler.backend, SimSampler.backend, _NoGpus.backend}


def test_a_value_outside_a_secondary_state_is_refused_where_it_enters():
    job = {"id": "1", "recipe": "r", "machine": "m", "state": "running", "started_at": 1.0, "output_dir": "/o", "log_path": "/l"}
    for field, bad in (("trainer_state", "evaluating"), ("precision", "int8"), ("stop_requested", "pause")):
        with pytest.raises(ValidationError, match=field):
            JobInfo.model_validate({**job, field: bad})
    with pytest.raises(ValidationError, match="engine"):
        ModelInfo(name="x", machine="m", engine="Ollama 2", state="cold", since=1.0)  # not an engine name's form
    with pytest.raises(ValidationError, match="kind"):
        CheckpointInfo(run="r", step=1, path="/p", kind="lora")  # type: ignore[arg-type]  # the point of the test
    node = JobNode.model_validate({"machine": "b", "state": "offline"})
    assert node.state == "offline" and JobNode.model_validate({"machine": "b", "state": "running"}).state is JobState.RUNNING
    with pytest.raises(ValidationError):
        JobNode.model_validate({"machine": "b", "state": "sleeping"})


# ---------------------------------------------------------------------------- a job's record


def a_job(tmp_path: Path) -> Job:
    return Job(
        id="box-1",
        recipe="r",
        machine="box",
        gpus=[0],
        params={"lr": 0.1},
        argv=["train"],
        cwd=str(tmp_path),
        output_dir=str(tmp_path / "out"),
        log_path=str(tmp_path / "job.log"),
        job_dir=str(tmp_path),
        started_at=1.0,
    )


def test_a_trainers_progress_file_is_a_progress_on_the_job_and_its_record_keeps_the_wire_form(tmp_path):
    job = a_job(tmp_path)
    write_progress(
        tmp_path / "progress.json",
        {
            "state": "running",
            "step": 7,
            "max_steps": 10,
            "loss": 1.5,
            "precision": "fp32",
            "checkpoints": [{"step": 5, "path": str(tmp_path / "checkpoint-5"), "save_s": 0.2}],
        },
    )
    assert update_progress(job)
    assert (
        type(job.progress) is JobProgress and job.progress.state == "running" and job.progress.step == 7
    )  # not the pid, the grad norm
    assert job.loss_points == [(7, 1.5)]
    job.nodes = [JobNode(machine="box", gpus=[0], state=JobState.RUNNING), JobNode(machine="b", state="offline")]
    record = json.loads(job.record())
    assert record["progress"]["step"] == 7 and "pid" not in record["progress"]  # the persisted form is the one it always was
    assert record["nodes"][1] == {"machine": "b", "gpus": [], "state": "offline", "exit_code": None, "error": None}
    back = Job.from_record(job.record())
    assert back.progress == job.progress and back.nodes == job.nodes and back.loss_points == job.loss_points
    info = back.info(simulated=True)
    assert (info.trainer_state, info.step, info.precision, info.checkpoints[0].step) == ("running", 7, "fp32", 5)
    assert back.view().reports == tuple(job.progress.checkpoints)


def test_a_progress_file_with_a_state_outside_the_protocol_is_a_problem_on_its_job(tmp_path):
    job = a_job(tmp_path)
    (tmp_path / "progress.json").write_text(json.dumps({"state": "evaluating", "step": 3, "updated_at": 5.0}))
    assert update_progress(job)
    assert job.progress is None and job.progress_problem is not None and "state" in job.progress_problem


def test_a_record_whose_nodes_do_not_fit_is_refused_and_an_older_record_still_reads(tmp_path):
    record = json.loads(a_job(tmp_path).record())
    with pytest.raises(ValueError, match="nodes"):
        Job.from_record(json.dumps({**record, "nodes": [{"machine": "b", "state": "sleeping"}]}))
    with pytest.raises(ValueError, match="stop_requested"):
        Job.from_record(json.dumps({**record, "stop_requested": "pause"}))
    older = {
        **record,
        "progress": {"state": "finished", "step": 9, "pid": 4, "grad_norm": 0.3},
        "loss_points": [[3, 1.0], [4, None]],
    }
    job = Job.from_record(json.dumps(older))
    assert job.progress == JobProgress(state="finished", step=9) and job.loss_points == [(3, 1.0)]


# ---------------------------------------------------------------------------- a node's status


def test_a_nodes_status_is_typed_where_it_enters_and_on_the_wire_as_before():
    plain = NodeStatus.model_validate({"state": "running", "progress": {}, "loss_points": [[1, 2.0]]})
    assert plain.progress is None and plain.model_dump(mode="json")["progress"] == {}  # {} on the wire for none, as always
    rank_0 = NodeStatus.model_validate({"state": "running", "progress": {"state": "running", "step": 4, "pid": 12}})
    assert rank_0.progress == JobProgress(state="running", step=4)
    misfit = NodeStatus.model_validate({"state": "failed", "exit_code": 1, "progress": {"checkpoints": 5}})
    assert misfit.progress is None and misfit.state is JobState.FAILED and misfit.exit_code == 1  # the rest of its news stands
    seen = NodeStatus.seen(JobState.FAILED, error="x" * (NODE_ERROR_CHARS + 10), last_lines=["a", "b", "c", "y" * 10000])
    assert (
        seen.error is not None
        and len(seen.error) == NODE_ERROR_CHARS
        and seen.last_lines[0] == "b"
        and len(seen.last_lines[-1]) == 4000
    )
    assert NodeStatus.model_validate(seen.model_dump(mode="json")) == seen  # what a node sends, its coordinator reads back


# ---------------------------------------------------------------------------- the port


async def test_the_jobs_are_reached_through_their_port(tmp_path):
    lab = parse_lab(
        yaml.safe_dump(
            {
                "lab": "t",
                "machines": [{"name": "box", "gpus": "none"}],
                "trainers": [
                    {
                        "name": "hello",
                        "machine": "box",
                        "command": [PY, "-c", "print('hello')"],
                        "output_dir": str(tmp_path / "runs/{job_id}"),
                    }
                ],
            }
        )
    )
    agent = Agent(lab, "box", tmp_path / "state", components=lambda core: [JobsComponent(core)])
    (tmp_path / "state").mkdir()
    agent.store = Store(tmp_path / "state" / "state.db")
    try:
        for component in agent.components:
            await component.start()
        port = agent.find(JobsPort)
        assert port is agent.components[0]
        assert port is not None
        detail = await port.launch("hello", {})
        assert isinstance(detail, JobDetail) and detail.recipe == "hello" and detail.argv[-1] == "print('hello')"

        def ended() -> JobView | None:
            agent.tick()
            view = port.view(detail.id)
            return view if not view.active else None

        view = await wait_for(ended, 30)
        assert view.state == JobState.EXITED and [v.id for v in port.views()] == [detail.id]
        with pytest.raises(RemoteError, match="no job 'box-99'"):
            port.view("box-99")
        with pytest.raises(RemoteError, match="no recipe"):
            await port.launch("nope", {})
    finally:
        for component in agent.components:
            await component.stop()
        agent.store.close()
