"""What tests/e2e/shell/test_lab_push.py, tests/fast/shell/test_lab_push.py share: P4, SIM, LAB, pool, alerts,
text_of, with_changes, started."""

from __future__ import annotations

import copy

import yaml

from agents.alerts.component import AlertsComponent
from agents.orchestra.component import OrchestraComponent

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


SIM = {"load_s": 0.1, "cold_factor": 1, "warmup_s": 0.05, "wake_s": 0.05, "tokens_per_s": 0, "placeholder_mib": 1}


LAB = {
    "lab": "push-lab",
    "machines": [{"name": "box", "gpus": {"sim": [P4, P4]}}],
    "models": [
        {"name": "tiny", "path": "models/tiny", "engine": "sim", "machine": "box", "gpus": [0], "vram_gib": 1, "sim": SIM}
    ],
    "alerts": {"temp_c": 85},
}


def pool(agent) -> OrchestraComponent:
    found = agent.find(OrchestraComponent)
    assert found is not None
    return found


def alerts(agent) -> AlertsComponent:
    found = agent.find(AlertsComponent)
    assert found is not None
    return found


def text_of(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def with_changes(**changes) -> dict:
    data = copy.deepcopy(LAB)
    data.update(changes)
    return data


async def started(in_process, data: dict | None = None):
    lab = await in_process(data or LAB)
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    return lab, client
