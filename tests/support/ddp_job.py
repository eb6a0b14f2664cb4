"""What tests/fast/cli/test_follow.py, tests/fast/jobs/test_multinode_names.py share: NODES, ddp_job."""

from __future__ import annotations

from typing import Any

from agents.wire.sections.jobs import JobDetail
from tests.support.checkpoints_view import frozen_app  # noqa: F401  (a fixture)

NODES = [{"machine": "m5", "gpus": [], "state": "starting"}, {"machine": "irina", "gpus": [], "state": "starting"}]


def ddp_job(**changes: Any) -> JobDetail:
    job = {
        "id": "m5-2",
        "recipe": "ddp-2node",
        "machine": "m5",
        "state": "starting",
        "started_at": 1.0,
        "output_dir": "runs/m5-2",
        "log_path": "logs/job-m5-2.log",
        "nodes": NODES,
    }
    return JobDetail.model_validate({**job, **changes})
