"""Prometheus exposition: a real agent process scraped over HTTP and parsed; the collector over jobs and models."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from agents.shell.demo.lab import DemoLab, free_ports
from agents.wire.agent_argv import agent_argv, python_agent
from tests.support.metrics import families
from tests.support.waits import wait_for

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


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


@pytest.mark.timeout(60)
async def test_agent_serves_prometheus_metrics(tmp_path, lab_file):
    demo = DemoLab(tmp_path / "run", source=lab_file(LAB))
    lab_path = demo.prepare()
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        agent_argv(
            python_agent(sys.executable),
            lab_path,
            "box",
            demo.dir / "agents" / "box",
            log_level="warning",
            extra=["--metrics-port", str(port)],
        ),
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
