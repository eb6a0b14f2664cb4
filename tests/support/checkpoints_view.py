"""What tests/e2e/orchestra/test_llamacpp_build.py, tests/fast/cli/test_follow.py,
tests/fast/costs/test_saving_words.py, tests/fast/jobs/test_multinode_names.py, tests/fast/lab/test_rotation_words.py,
tests/fast/orchestra/test_llamacpp_build.py, tests/fast/tui/test_checkpoints_view.py,
tests/fast/tui/test_view_words.py share: frozen_run, frozen_app."""

from __future__ import annotations

import math
import time

import pytest

from console.lab.client import FleetClient
from console.tui.app import CetlabApp
from tests.support.console import FROZEN_NOW, frozen_state

# ---------------------------------------------------------------------------- snapshot


def frozen_run() -> tuple[dict, dict]:
    """A 300-step run, loss every 5 steps, eval every 50, a checkpoint every 50 (one half-written)."""
    loss = [[s, round(0.9 + 5.6 * math.exp(-s / 70) + 0.08 * math.sin(s / 7), 4)] for s in range(5, 301, 5)]
    evals = [[s, round(1.1 + 5.0 * math.exp(-s / 80) + (0.15 if s == 300 else 0.0), 4)] for s in range(50, 301, 50)]
    at = dict(loss)
    checkpoints = []
    for i, step in enumerate(range(50, 301, 50)):
        checkpoints.append(
            {
                "run": "m5-3",
                "step": step,
                "epoch": round(step / 12.5, 2),
                "path": f"/runs/m5-3/checkpoint-{step}",
                "written_at": FROZEN_NOW - 60 * (6 - i),
                "size_bytes": 3_400_000 + 1000 * i,
                "loss": at[step],
                "eval_loss": dict(evals)[step],
                "save_s": 0.4 + 0.05 * i,
                "save_s_from": "trainer",
                "is_best": step == 250,
                "kept": step == 100,
                "newest": step == 300,
                "kind": "adapter",
                "has_optimizer": True,
                "complete": True,
                "problem": None,
                "in_use": None,
                "serving": {"model": "m5-3-step250", "mode": "merged", "state": "warm", "error": None} if step == 250 else None,
            }
        )
    checkpoints.append(
        {
            **checkpoints[-1],
            "step": 350,
            "path": "/runs/m5-3/checkpoint-350",
            "loss": None,
            "eval_loss": None,
            "save_s": None,
            "is_best": False,
            "newest": False,
            "kept": False,
            "complete": False,
            "problem": "save in progress (written 1 s ago)",
            "written_at": FROZEN_NOW - 1,
            "serving": None,
        }
    )
    summary = {
        "run": "m5-3",
        "machine": "m5",
        "path": "/runs/m5-3",
        "job": "m5-3",
        "recipe": "demo-lora",
        "job_state": "exited",
        "count": 6,
        "incomplete": 1,
        "newest_step": 300,
        "best_step": 250,
        "best_loss": evals[4][1],
        "disk_bytes": sum(c["size_bytes"] for c in checkpoints),
        "save_s_total": 3.15,
        "wall_s": 412.0,
        "save_share_pct": 0.76,
    }
    return summary, {**summary, "checkpoints": checkpoints, "curves": {"loss": loss, "eval_loss": evals}}


@pytest.fixture
def frozen_app(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    state = frozen_state()
    summary, _ = frozen_run()
    state.machines["m5"].apply_section("checkpoints", [summary])
    yield CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    monkeypatch.delenv("TZ")
    time.tzset()
