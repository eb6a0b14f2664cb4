"""Prometheus exposition: a real agent process scraped over HTTP and parsed; the collector over jobs and models."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.alerts.component import AlertsComponent
from agents.costs.component import CostsComponent
from agents.runtime.hooks import Hooks
from agents.runtime.store import Store
from agents.shell.agent import Agent
from agents.shell.demo.lab import DemoLab, free_ports
from agents.shell.metrics import AgentCollector
from agents.wire.lab.model import parse_lab
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo, ModelsSection
from tests.conftest import wait_for

LAB = {
    "lab": "metrics-lab",
    "costs": {"currency": "EUR", "electricity_per_kwh": 0.25},
    "cloud_prices": {"gpu_hour": {"Tesla V100": 2.48}},
    "machines": [
        {
            "name": "box",
            "idle_watts": 80,
            "gpus": {
                "sim": [
                    {"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250, "profile": "training"},
                    {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75},
                ]
            },
        }
    ],
}


def families(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


@pytest.mark.timeout(60)
async def test_agent_serves_prometheus_metrics(tmp_path, lab_file):
    demo = DemoLab(tmp_path / "run", source=lab_file(LAB))
    lab_path = demo.prepare()
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.shell.daemon",
            "--log-level",
            "warning",
            "serve",
            "--lab",
            str(lab_path),
            "--machine",
            "box",
            "--state-dir",
            str(demo.dir / "agents" / "box"),
            "--metrics-port",
            str(port),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def energy_counted() -> dict | None:
            try:
                found = families(scrape(port))
            except (OSError, urllib.error.URLError):
                return None
            joules = sum(s.value for s in found.get("cetlab_energy_joules", []) if s.name == "cetlab_energy_joules_total")
            return found if joules > 0 else None

        found = await wait_for(energy_counted, timeout=30, interval=0.3)
        util = {s.labels["gpu"]: s for s in found["DCGM_FI_DEV_GPU_UTIL"]}
        assert sorted(util) == ["0", "1"]
        assert util["0"].labels["modelName"] == "Tesla V100" and util["0"].labels["Hostname"] == "box"
        assert util["0"].labels["UUID"].startswith("SIM-00") and util["0"].labels["device"] == "nvidia0"
        fb = {s.labels["gpu"]: s.value for s in found["DCGM_FI_DEV_FB_USED"]}
        free = {s.labels["gpu"]: s.value for s in found["DCGM_FI_DEV_FB_FREE"]}
        assert fb["1"] + free["1"] == pytest.approx(8 * 1024)  # MiB, as dcgm-exporter reports them
        assert all(s.value == 1 for s in found["cetlab_gpu_simulated"])
        assert found["cetlab_host_memory_total_bytes"][0].value > 0
        per_hour = found["cetlab_cost_per_hour"][0]
        assert per_hour.labels == {"Hostname": "box", "currency": "EUR"}
        watts = found["cetlab_power_watts"][0].value
        assert watts > 80 and per_hour.value == pytest.approx(watts / 1000 * 0.25, rel=1e-3)
        owners = {(s.labels["kind"], s.labels["owner"]) for s in found["cetlab_energy_joules"]}
        assert ("host", "host") in owners and ("other", "gpu0") in owners
        with pytest.raises(urllib.error.HTTPError) as info:
            scrape(port, "/secrets")
        assert info.value.code == 404
    finally:
        proc.terminate()
        proc.wait(10)


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
