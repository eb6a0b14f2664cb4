"""The agent's start plan against an operator: an operator's warm wins over the plan's sleep."""

from __future__ import annotations

import json

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from tests.support.cli_labs import FAST, cli, sim_model

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- 1: `cetlab warm` during the start plan


@pytest.fixture()
def plan_lab(tmp_path):
    """One machine whose start plan brings model p up and then puts it to sleep (slow enough to ask during it)."""
    slow = {**FAST, "load_s": 4.0, "cold_factor": 1.0}
    data = {
        "lab": "start-plan",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "models": [{**sim_model("p", 0), "sim": slow}],
        "orchestra": {"sleeping": ["p"]},
    }
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(tmp_path / "run", source=tmp_path / "lab.yaml") as demo:
        yield demo


def test_an_operators_warm_wins_over_the_start_plans_sleep(plan_lab):
    done = cli(plan_lab.lab_path, "warm", "p", "--wait-timeout", "60")
    assert done.stderr.startswith("p: loading"), done.stderr  # asked while the start plan was bringing it up
    assert done.returncode == 0, done.stderr  # before: the plan put it to sleep and the wait hung to its timeout
    assert done.stdout.startswith("p on box GPU 0: warm"), done.stdout
    after = json.loads(cli(plan_lab.lab_path, "--json", "models").stdout)
    assert [m["state"] for m in after["models"]] == ["warm"]
