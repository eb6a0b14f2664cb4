"""Typed state: finite numbers by type, validated documents, unique run names, a two-phase tick, sections as the wire carries them."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from agents.checkpoints.discovery import RANK_MARK, safe_name, unique_names
from agents.costs.component import CostsComponent
from agents.runtime.hooks import Hooks
from agents.runtime.rpc import Peer
from agents.runtime.store import Store
from agents.shell.agent import Agent
from agents.wire.documents import BadDocument, ChildRecord, ExitRecord, load_progress, load_quietly, load_trainer_state
from agents.wire.lab.model import LabError, parse_lab
from agents.wire.protocol import EVENT_TICK, GpuSample, Telemetry
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.tick import SECTION_MODELS
from agents.wire.states import JOB_ACTIVE, MODEL_ENGINE_UP, MODEL_HOLDS_GPU, JobState, ModelState
from tests.support.waits import wait_for

ONE_GPU = "lab: t\nmachines: [{name: box, idle_watts: 10, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"


# ---------------------------------------------------------------------------- numbers and states


def test_non_finite_numbers_become_null_where_they_enter():
    gpu = GpuSample(index=0, name="x", temp_c=float("nan"), power_w=float("inf"), util_pct=float("-inf"), fan_pct=40.0)
    assert (gpu.temp_c, gpu.power_w, gpu.util_pct, gpu.fan_pct) == (None, None, None, 40.0)
    job = JobInfo(
        id="1",
        recipe="r",
        machine="m",
        state="running",
        started_at=1.0,
        output_dir="/o",
        log_path="/l",
        loss=float("nan"),
        params={"lr": float("inf"), "name": "x"},
    )
    wire = job.to_wire()
    assert wire["loss"] is None and wire["params"] == {"lr": None, "name": "x"}
    json.dumps(wire, allow_nan=False)  # encodable as the wire encodes
    with pytest.raises(ValidationError):  # a required time is refused rather than nulled
        Telemetry(machine="m", t=float("nan"))


def test_states_are_enums_with_named_sets():
    assert JobState("running") is JobState.RUNNING and JobState.RUNNING == "running"
    assert JOB_ACTIVE == {JobState.STARTING, JobState.RUNNING, JobState.STOPPING}
    assert ModelState.SLEEPING not in MODEL_HOLDS_GPU and ModelState.SLEEPING in MODEL_ENGINE_UP  # the two old "UP"s, named
    with pytest.raises(ValidationError):
        JobInfo(id="1", recipe="r", machine="m", state="sleeping", started_at=1.0, output_dir="/o", log_path="/l")


def test_lab_yaml_numbers_must_be_finite():
    for bad in ("idle_watts: .inf", "hourly_rate: .nan", "ram_cache_gib: -.inf"):
        with pytest.raises(LabError, match=r"^lab.yaml:4: machines\[0\]\.\w+: Input should be a finite number"):
            parse_lab(f"lab: t\nmachines:\n  - name: m\n    {bad}\n")


# ---------------------------------------------------------------------------- documents from disk


def test_progress_documents_are_validated_and_a_nan_loss_is_a_divergence(tmp_path):
    path = tmp_path / "progress.json"
    path.write_text(
        '{"version": 1, "state": "running", "step": 12, "loss": NaN, "notes": ["bf16 on a P40"], "precision": "fp32", "new_key": 1}'
    )
    doc = load_progress(path)
    assert doc.loss is None and doc.diverged_step == 12 and doc.notes == ["bf16 on a P40"] and doc.precision == "fp32"
    path.write_text('{"state": "running", "step": 20, "loss": null, "diverged_at_step": 9}')
    assert load_progress(path).diverged_step == 9  # a trainer that writes null and says where
    path.write_text('{"state": "running", "checkpoints": 5}')
    with pytest.raises(BadDocument, match=r"progress.json: checkpoints: Input should be a valid list"):
        load_progress(path)
    path.write_text("[1, 2]")
    with pytest.raises(BadDocument, match="not a JSON object"):
        load_progress(path)
    path.write_text('{"state": "runn')  # torn: no news, not an error
    assert load_progress(path) is None
    assert load_progress(tmp_path / "missing.json") is None


def test_trainer_state_keeps_where_the_loss_went_nan(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(
        '{"epoch": Infinity, "log_history": [{"step": 1, "loss": 2.0}, "junk", {"step": 2, "loss": NaN}, {"step": 3, "loss": NaN}]}'
    )
    state = load_trainer_state(path)
    assert state.epoch is None and state.diverged_at_step == 2 and [r.loss for r in state.log_history] == [2.0, None, None]
    path.write_text('{"log_history": 5}')
    with pytest.raises(BadDocument, match="log_history"):
        load_trainer_state(path)


def test_a_runners_record_that_fits_no_schema_counts_as_absent(tmp_path):
    path = tmp_path / "exit.json"
    path.write_text('{"exit_code": "zero", "ended_at": NaN}')
    assert load_quietly(path, ExitRecord) is None
    path.write_text('{"exit_code": 0, "ended_at": NaN}')
    assert load_quietly(path, ExitRecord) == ExitRecord(exit_code=0, ended_at=None)
    path.write_text('{"pid": [1]}')
    assert load_quietly(path, ChildRecord) is None


# ---------------------------------------------------------------------------- run names


def test_run_names_are_unique_by_construction():
    wanted = [
        safe_name("exp"),
        safe_name("exp-~~"),
        safe_name("~~exp~~"),
        safe_name("x" * 80 + "a"),
        safe_name("x" * 80 + "b"),
        safe_name("~~"),
    ]
    assert wanted == ["exp", "exp", "exp", "x" * 64, "x" * 64, "run"]
    names = unique_names(wanted)
    assert names == ["exp", f"exp{RANK_MARK}2", f"exp{RANK_MARK}3", "x" * 64, f"{'x' * 64}{RANK_MARK}2", "run"]
    assert RANK_MARK not in "".join(wanted)  # so a ranked name can equal no folder's own name
    assert all(RANK_MARK not in safe_name(text) for text in ("a~b", "~", "exp~2", "é~é"))


# ---------------------------------------------------------------------------- the tick


class Owner(Hooks):
    """A state owner that takes a GPU at a given tick: the jobs section the agent's jobs component would make."""

    name = "jobs"

    def __init__(self, agent_ticks, at_tick: int):
        self.ticks, self.at_tick, self.jobs = agent_ticks, at_tick, []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def on_telemetry(self, telemetry) -> None:
        if self.ticks() == self.at_tick:
            self.jobs = [
                JobInfo(
                    id="box-1",
                    recipe="r",
                    machine="box",
                    gpus=[0],
                    state="running",
                    started_at=1.0,
                    output_dir="/o",
                    log_path="/l",
                )
            ]

    def section(self):
        return self.jobs


class Untyped(Hooks):
    """A component whose section is not typed: a NaN reaches the broadcast."""

    name = "broken"

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def section(self):
        return {"loss": float("nan")}


async def test_readers_see_the_tick_the_owners_just_made(tmp_path):
    """Costs runs before jobs in the component list, yet books the GPU to the job from the very tick the job took it."""
    agent = Agent(parse_lab(ONE_GPU), "box", tmp_path, components=lambda core: [CostsComponent(core)])
    costs = agent.find(CostsComponent)
    assert costs is not None
    agent.components.append(Owner(lambda: agent.ticks, at_tick=1))
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    agent.tick()  # the job takes GPU 0 in this tick
    agent.tick()  # the interval since the first tick is booked, both of its ends
    assert {r["kind"] for r in costs.ledger.rows() if r["kind"] != "host"} == {"job"}  # one tick behind, half of it was "other"
    agent.store.close()


async def test_a_non_finite_number_past_the_types_goes_out_as_null_and_the_tick_goes_on(tmp_path):
    agent = Agent(parse_lab(ONE_GPU), "box", tmp_path, components=lambda core: [Untyped(), CostsComponent(core)])
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    sent: list[dict] = []
    agent.peers.add(Peer(role="viewer", who="test", send=lambda line: sent.append(json.loads(line)), topics={EVENT_TICK}))
    agent.tick()
    agent.tick()
    assert len(sent) == 2
    assert (
        sent[0]["data"]["changed"]["broken"] == {"loss": None} and {"costs", "host", "gpus"} <= sent[0]["data"]["changed"].keys()
    )
    agent.store.close()


async def test_every_section_on_the_wire_parses_into_its_model(in_process):
    running = await in_process()  # the JSON lines of a real agent, through a memory pipe: the same as over SSH
    lab = running.lab
    gateway_here = lab.gateway is not None and lab.gateway.machine == "box"  # the gateway's section: on its machine only
    async with running.client(subscribe=[EVENT_TICK]) as client:
        await client.wait_connected(30)
        status = await client.call("box", "status")
        for name, model in SECTION_MODELS.items():
            if name == "gateway" and not gateway_here:
                assert status.get(name) is None  # null (or absent, from an older agent): no gateway on this machine
                continue
            assert name in status, name
            TypeAdapter(model).validate_python(status[name])
        view = client.state.machines["box"]
        # the console's LabState parses each section of the stream once into its model: none refused
        await wait_for(lambda: view.gpus and view.gpu_status is not None and view.costs is not None, timeout=15)
        assert view.problems == {} and view.host.ram_total_bytes


def test_models_module_documents_every_section():
    doc = Path(importlib.import_module("agents.wire.sections").__file__).read_text()
    for name in SECTION_MODELS:
        assert f"\n    {name} " in doc, name
