"""The supervised-training bench runs as `make bench` runs it, without the venv on PATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli_labs import PY

REPO = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- 2: make bench


@pytest.mark.slow
def test_the_supervised_training_bench_runs_without_the_venv_on_path(tmp_path):
    """`make bench` runs .venv/bin/python bench/...: the venv's bin folder is not on PATH."""
    venv_bin = str(Path(PY).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != venv_bin)
    env = {**os.environ, "PATH": path, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [PY, "bench/bench_train_supervised.py", "--steps", "4", "--rounds", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["bare_steps_per_s"] > 0 and figures["supervised_steps_per_s"] > 0
