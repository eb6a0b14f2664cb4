"""Wiring between the merged parts: the start plan, the pool's VRAM, store notices, gateway costs."""

from __future__ import annotations

import pytest

from agents.lab import load_lab
from console.client import FleetClient
from tests.test_orchestra import pool_lab, run_pool, settle, sim_model  # noqa: F401 (run_pool is a fixture)

pytestmark = pytest.mark.timeout(120)

async def test_one_model_failing_in_the_start_plan_leaves_the_rest_of_the_plan_running(run_pool):
    # a's engine dies while loading (its supervisor cancels the bring-up); b, later in the plan, still comes up and sleeps
    demo = run_pool(pool_lab(
        [sim_model("a", [0], 6, load_s=30, fail_after_s=0.2), sim_model("b", [1], 4)],
        orchestra={"warm": ["a"], "sleeping": ["b"]},
    ))
    async with FleetClient(load_lab(demo.lab_path)) as client:
        await client.wait_connected(10)
        a = await settle(client, "a", ("failed",))
        assert "exited" in a["error"]["message"] and a["error"]["oom"], a["error"]
        b = await settle(client, "b", ("sleeping",))
        assert b["error"] is None
