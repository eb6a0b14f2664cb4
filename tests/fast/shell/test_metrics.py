"""Prometheus exposition: a real agent process scraped over HTTP and parsed; the collector over jobs and models."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from agents.alerts.component import AlertsComponent
from agents.costs.component import CostsComponent
from agents.runtime.hooks import Hooks
from agents.runtime.store import Store
from agents.shell.agent import Agent
from agents.shell.metrics import AgentCollector
from agents.wire.lab.model import parse_lab
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo, ModelsSection
from tests.support.metrics import families


class Section(Hooks):
    """A stand-in for the jobs or models component: just its section, typed as the real component makes it."""

    def __init__(self, name: str, data):
        self.name, self.data = name, data

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def section(self):
        return self.data


async def test_collector_labels_jobs_models_tokens_and_alerts(tmp_path):
    lab = parse_lab(
        "lab: t\ncosts: {electricity_per_kwh: 0.2}\nalerts: {temp_for_s: 0}\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n"
    )
    jobs = Section(
        "jobs",
        [
            JobInfo(
                id="4",
                recipe="demo-lora",
                machine="box",
                gpus=[0],
                state="running",
                step=120,
                loss=1.25,
                started_at=1.0,
                output_dir="/runs/4",
                log_path="/logs/4",
            )
        ],
    )
    llama = ModelInfo(
        name="llama",
        machine="box",
        engine="sim",
        gpus=[],
        state="warm",
        since=1.0,
        prompt_tokens_total=10,
        generation_tokens_total=20,
    )
    models = Section("models", ModelsSection(models=[llama]))
    agent = Agent(lab, "box", tmp_path, components=lambda core: [CostsComponent(core), AlertsComponent(core), jobs, models])
    agent.store = Store(tmp_path / "state.db")
    await agent.start_components()
    agent.tick()
    llama.generation_tokens_total = 520  # 500 tokens served since the first look
    agent.gpus.override(0, temp_c=99.0)
    await asyncio.sleep(0.01)  # the point, not a wait: the second tick reads a later clock, so energy is counted
    agent.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector([agent]))
    found = families(generate_latest(registry).decode())
    assert [(s.labels["job"], s.labels["state"], s.labels["recipe"]) for s in found["cetlab_job_info"]] == [
        ("4", "running", "demo-lora")
    ]
    assert found["cetlab_job_step"][0].value == 120 and found["cetlab_job_loss"][0].value == 1.25
    assert [(s.labels["model"], s.labels["state"]) for s in found["cetlab_model_state"]] == [("llama", "warm")]
    assert [(s.labels["model"], s.value) for s in found["cetlab_model_tokens"] if s.name.endswith("_total")] == [("llama", 500.0)]
    assert {s.labels["owner"] for s in found["cetlab_energy_joules"]} >= {"host", "4"}  # the job's GPU energy is the job's
    assert found["DCGM_FI_DEV_GPU_TEMP"][0].value == 99.0
    assert [(s.labels["rule"], s.labels["level"], s.value) for s in found["cetlab_alerts_active"]] == [
        ("gpu_hot", "critical", 1.0)
    ]
    agent.store.close()
