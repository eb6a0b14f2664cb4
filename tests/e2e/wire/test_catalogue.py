"""The method catalogue against a real agent: every method it registers is catalogued (and back), every reply
validates against its result model and round-trips to the JSON the agent sent, a bad reply is a typed error."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from agents.shell.demo.lab import DemoLab
from agents.wire.catalogue.agent import OverrideParams
from agents.wire.catalogue.alerts import AckParams, AlertListParams
from agents.wire.catalogue.audit import AuditListParams
from agents.wire.catalogue.checkpoints import (
    DeleteParams,
    KeepParams,
    PruneParams,
    ResumeParams,
    RunParams,
    ServeParams,
)
from agents.wire.catalogue.costs import CostsParams
from agents.wire.catalogue.gateway import KeyAddParams, KeyNameParams
from agents.wire.catalogue.index import CATALOGUE, parse_result
from agents.wire.catalogue.jobs import JobListParams, JobParams, LogsParams, StartParams, StopParams
from agents.wire.catalogue.lab import LabApplyParams, LabRollbackParams
from agents.wire.catalogue.method import Method, request
from agents.wire.catalogue.models import AdapterParams, ModelParams, PinParams, SwapParams
from agents.wire.catalogue.notify import NotifyTestParams
from agents.wire.catalogue.queue import EntryParams, QueueListParams, SubmitParams
from agents.wire.lab.model import load_lab
from agents.wire.protocol import HistoryParams, IntervalParams, Role, SubscribeParams
from console.lab.client import FleetClient
from tests.support.lab import HOUR_S, age, kill_jobs_left
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(240)


PY = sys.executable


P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


SIM = {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.1, "wake_s": 0.1, "tokens_per_s": 0, "placeholder_mib": 1}


# A trainer that reports progress and writes one LoRA checkpoint (aged past the settle window), then waits to be stopped.
TRAINER = """
import json, os, pathlib, sys, time
out = pathlib.Path(sys.argv[1]); ck = out / "checkpoint-2"; ck.mkdir(parents=True, exist_ok=True)
(ck / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny"}))
(ck / "adapter_model.safetensors").write_bytes(b"0" * 64)
(ck / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]}))
then = time.time() - 3600
for p in [*ck.rglob("*"), ck]:
    os.utime(p, (then, then))
pathlib.Path(os.environ["CETLAB_PROGRESS_FILE"]).write_text(json.dumps({"state": "running", "step": 2, "max_steps": 10, "loss": 1.5, "updated_at": time.time(),
    "checkpoints": [{"step": 2, "path": str(ck), "save_s": 0.1, "at": time.time()}]}))
print("training", flush=True)
time.sleep(600)
"""


def hand_run(root: Path, name: str, steps: list[int]) -> None:
    """A run not started by cetlab: LoRA checkpoints with a trainer_state.json each, written an hour ago."""
    for step in steps:
        ck = root / name / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        (ck / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny"}))
        (ck / "adapter_model.safetensors").write_bytes(b"0" * 64)
        history = [{"step": s, "loss": 3.0 - s / 10} for s in range(1, step + 1)] + [{"step": step, "eval_loss": 2.5 - step / 10}]
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))
        age(ck, HOUR_S)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoLab]:
    root = tmp_path_factory.mktemp("catalogue")
    hand = root / "hand"
    hand_run(hand, "exp1", [1, 2, 3])
    hand_run(hand, "exp2", [1, 2, 3, 4])
    model = {"engine": "sim", "machine": "box", "gpus": [1], "vram_gib": 1, "sim": SIM}
    data = {
        "lab": "catalogue-test",
        "costs": {"electricity_per_kwh": 0.30},
        "alerts": {"temp_c": 85, "temp_for_s": 1},
        "cloud_prices": {"gpu_hour": {"Tesla P4": 0.5}},
        "machines": [{"name": "box", "gpus": {"sim": [P4, P4]}}],
        "models": [{"name": "alpha", "path": "models/alpha", **model}, {"name": "beta", "path": "models/beta", **model}],
        "orchestra": {"warm": ["alpha"], "rotation": [["alpha"], ["beta"]]},
        "gateway": {"machine": "box", "models": {"alpha": {"aliases": ["a"]}}},
        "trainers": [
            {
                "name": "fake",
                "machine": "box",
                "gpus": [0],
                "command": [PY, "-c", TRAINER, "{output_dir}"],
                "output_dir": "runs/{job_id}",
                "stop_grace_s": 5,
                "params": [
                    {"name": "resume_from_checkpoint", "type": "str"},
                    {"name": "max_steps", "type": "int", "default": 10},
                ],
            },
            # no GPU here has 1000 GiB: it waits in the lab queue, for its methods to be walked
            {
                "name": "never",
                "machine": "box",
                "need": {"gpus": 1, "min_vram_gib": 1000},
                "command": [PY, "-c", "pass"],
                "output_dir": "runs/{job_id}",
            },
        ],
        "checkpoints": {"dirs": [{"machine": "box", "path": str(hand)}], "poll_s": 1, "settle_s": 5},
        "notify": {"routes": [{"name": "hook", "kind": "webhook", "url": "http://127.0.0.1:1/hook"}]},
    }
    source = root / "src" / "lab.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(root / "run", source=source) as demo:
        yield demo
    kill_jobs_left(root / "run")


def round_trips(method: Method[Any, Any], raw: Any) -> BaseModel:
    """The reply typed, and typed completely: dumping the model gives back every key and value the agent sent."""
    typed = parse_result(method.name, raw)
    assert isinstance(typed, method.result)
    assert typed.model_dump(mode="json", by_alias=True, exclude_unset=True) == raw, (
        f"{method.name}: the model loses or changes fields"
    )
    return typed


class Walk:
    """Calls methods through the real SSH client and request(), checks each raw reply, remembers which methods it called."""

    def __init__(self, client: FleetClient) -> None:
        self.client = client
        self.called: set[str] = set()
        self.raw: Any = None

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        self.raw = await self.client.call(machine, method, params, timeout)
        return self.raw

    async def __call__(self, method: Method[Any, Any], params: BaseModel | None = None) -> Any:
        typed = await request(self, "box", method, params)
        assert type(typed) is type(round_trips(method, self.raw))
        self.called.add(method.name)
        return typed


@pytest.fixture
async def walk(lab):
    async with FleetClient(load_lab(lab.lab_path), subscribe=[]) as client:
        await client.wait_connected(20)
        yield Walk(client)


async def test_the_agent_registers_exactly_the_catalogue(walk):
    methods = await walk(CATALOGUE["methods"])
    assert {m.name for m in methods.root} == set(CATALOGUE)
    for m in methods.root:
        assert m.role is CATALOGUE[m.name].role and m.doc == CATALOGUE[m.name].doc, m.name


async def test_every_method_answers_its_result_model(walk, lab):
    c = CATALOGUE
    hello = await walk(c["hello"])
    assert hello.role is Role.OPERATOR and hello.machine == "box"
    await walk(c["ping"])
    await walk(c["set_interval"], IntervalParams(interval_s=0.5))
    await walk(c["subscribe"], SubscribeParams(topics=["notice"]))
    await walk(c["unsubscribe"], SubscribeParams(topics=["notice"]))
    await walk(c["sim.override"], OverrideParams(gpu=1, temp_c=99))  # a hot GPU: an alert to list and ack

    # a job that reports progress and a checkpoint
    recipes = await walk(c["jobs.recipes"])
    assert [r.name for r in recipes.root] == ["fake", "never"]
    job = await walk(c["jobs.start"], StartParams(recipe="fake"))
    await wait_for(lambda: (lab.dir / "runs" / job.id / "checkpoint-2").exists(), timeout=30)
    listed = await wait_for(lambda: _job_with_step(walk.client, job.id), timeout=30)
    assert listed.step == 2
    await walk(c["jobs.list"], JobListParams(limit=10))
    assert (await walk(c["jobs.get"], JobParams(id=job.id))).argv
    await walk(c["jobs.logs"], LogsParams(id=job.id, tail_lines=5))

    # models
    await wait_for(lambda: _state(walk.client, "alpha", "warm"), timeout=30)
    await walk(c["models.list"])
    await walk(c["models.get"], ModelParams(model="alpha"))
    await walk(c["models.pin"], PinParams(model="alpha", pinned=True))
    await walk(c["models.pin"], PinParams(model="alpha", pinned=False))
    await walk(c["models.rotation"])
    await walk(c["models.cache"], ModelParams(model="beta"))
    await walk(c["gpus.support"])
    await walk(c["history"], HistoryParams(max_points=10))

    # checkpoints: the hand-made runs and the job's
    runs = await wait_for(lambda: _runs(walk.client, {"exp1", "exp2", job.id}), timeout=30)
    assert {r.run for r in runs.root} >= {"exp1", "exp2"}
    await walk(c["checkpoints.runs"])
    listing = await walk(c["checkpoints.list"], RunParams(run="exp1"))
    assert [ck.step for ck in listing.checkpoints] == [1, 2, 3] and listing.curves.loss
    await walk(c["checkpoints.keep"], KeepParams(run="exp1", step=1))
    await walk(c["checkpoints.delete"], DeleteParams(run="exp2", step=1))
    await walk(c["checkpoints.prune"], PruneParams(run="exp2", keep_last=1))
    run_dir = lab.dir / "runs" / job.id
    await walk(c["jobs.kill"], JobParams(id=job.id))
    await wait_for(lambda: _job_ended(walk.client, job.id), timeout=30)
    resumed = await walk(c["checkpoints.resume"], ResumeParams(run=job.id, step=2))
    assert resumed.resumed_from.step == 2
    await walk(c["jobs.stop"], StopParams(id=resumed.id, grace_s=1))
    await walk(c["models.adapter"], AdapterParams(model="alpha", name="exp1-3", path=str(run_dir / "checkpoint-2")))
    await walk(c["checkpoints.serve"], ServeParams(run="exp1", step=3, model="alpha"))

    # the lab queue (this machine keeps it): an entry that waits, held, released, listed, cancelled
    entry = await walk(c["queue.submit"], SubmitParams(recipe="never"))
    assert entry.state == "queued" and entry.reason and "1000 GiB" in entry.reason
    await walk(c["queue.hold"], EntryParams(id=entry.id))
    await walk(c["queue.release"], EntryParams(id=entry.id))
    await walk(c["queue.list"], QueueListParams())
    await walk(c["queue.cancel"], EntryParams(id=entry.id))

    # costs, alerts, audit, notify, gateway, the whole status
    await wait_for(lambda: _alert(walk.client), timeout=30)
    alerts = await walk(c["alerts.list"], AlertListParams(active=True))
    await walk(c["alerts.ack"], AckParams(id=alerts.alerts[0].id))
    await walk(c["costs.get"], CostsParams(by="job"))
    await walk(c["costs.get"], CostsParams())
    await walk(c["notify.status"])
    await walk(c["notify.test"], NotifyTestParams(route="hook"))
    issued = await walk(c["gateway.keys.add"], KeyAddParams(name="walker", rpm=10))
    assert issued.key
    await walk(c["gateway.keys.list"])
    await walk(c["gateway.keys.revoke"], KeyNameParams(name="walker"))
    await walk(c["gateway.status"])
    from agents.wire.catalogue.doctor import DoctorParams

    assert (await walk(c["doctor.run"], DoctorParams(timeout_s=120))).checks
    audit = await walk(c["audit.list"], AuditListParams(limit=20))
    assert audit.entries and audit.entries[0].outcome == "ok"
    status = await walk(c["status"])
    assert status.models is not None and status.gateway is not None and status.jobs

    # lab.yaml pushed (the same lab, a comment more: every component takes it live) and rolled back
    text = lab.lab_path.read_text() + "# walked\n"
    await walk(c["lab.apply"], LabApplyParams(text=text, dry_run=True))
    applied = await walk(c["lab.apply"], LabApplyParams(text=text))
    assert applied.changed and applied.live == [] and applied.restart == []
    await walk(c["lab.rollback"], LabRollbackParams())

    # the cold, sleep, warm, swap and rotate of the pool last: they move alpha about
    await walk(c["models.sleep"], ModelParams(model="alpha"))
    await wait_for(lambda: _state(walk.client, "alpha", "sleeping"), timeout=30)
    await walk(c["models.warm"], ModelParams(model="alpha"))
    await wait_for(lambda: _state(walk.client, "alpha", "warm"), timeout=30)
    await walk(c["models.swap"], SwapParams.model_validate({"out": "alpha", "in": "beta"}))
    await wait_for(lambda: _state(walk.client, "beta", "warm"), timeout=30)
    await walk(c["models.cold"], ModelParams(model="beta"))
    await walk(c["models.rotate"])

    # the multi-node and rpc-helper methods need a second agent: tests/e2e/jobs/test_multinode.py and
    # tests/e2e/orchestra/test_spread_llamacpp.py call them, and the agent checks every result against the catalogue before it sends
    # it (Registry.check_results), so a wrong model fails there
    node_methods = {"jobs.node_start", "jobs.node_stop", "jobs.node_status", "methods"}
    node_methods |= {"models.rpc_start", "models.rpc_stop", "models.rpc_status"}
    assert set(CATALOGUE) - walk.called == node_methods


async def _job_with_step(client: FleetClient, job_id: str) -> Any:
    jobs = await request(client, "box", CATALOGUE["jobs.list"], JobListParams())
    job = next(j for j in jobs.root if j.id == job_id)
    return job if job.step is not None else None


async def _job_ended(client: FleetClient, job_id: str) -> bool:
    return (await request(client, "box", CATALOGUE["jobs.get"], JobParams(id=job_id))).ended_at is not None


async def _state(client: FleetClient, model: str, state: str) -> bool:
    listing = await request(client, "box", CATALOGUE["models.list"])
    return any(m.name == model and m.state == state for m in listing.models)


async def _runs(client: FleetClient, names: set[str]) -> Any:
    runs = await request(client, "box", CATALOGUE["checkpoints.runs"])
    return runs if {r.run for r in runs.root} >= names else None


async def _alert(client: FleetClient) -> bool:
    return bool((await request(client, "box", CATALOGUE["alerts.list"], AlertListParams(active=True))).alerts)


def test_cli_params_that_do_not_validate_are_said_before_they_go_out(lab, capsys):
    from console.cli.main import main

    assert main(["--lab", str(lab.lab_path), "--json", "gateway", "keys", "add", "bad name!"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["code"] == "invalid_params"
    assert "name: 'bad name!' is not a name: letters, digits" in captured.err
    assert main(["--lab", str(lab.lab_path), "--json", "gateway", "keys", "list"]) == 0
    assert "keys" in json.loads(capsys.readouterr().out)
