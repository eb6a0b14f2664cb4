"""What tests/e2e/jobs/test_what_trainers_write.py, tests/e2e/shell/test_non_files.py share: SIM_GPU, ticking,
job_in_section."""

from __future__ import annotations

from console.lab.client import FleetClient
from tests.support.waits import wait_for

SIM_GPU = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


async def ticking(client: FleetClient, machine: str = "box") -> None:
    """Ticks still arrive after this point, and the agent answers calls: it was not silenced."""
    view = client.state.machines[machine]
    seen = view.sample_t
    await wait_for(lambda: view.sample_t is not None and view.sample_t != seen, timeout=15)
    status = await client.call(machine, "status")
    assert status["machine"] == machine and {"jobs", "costs", "alerts"} <= status.keys()


def job_in_section(client: FleetClient, job_id: str) -> dict | None:
    return next((j.model_dump(mode="json") for j in client.state.machines["box"].jobs if j.id == job_id), None)
