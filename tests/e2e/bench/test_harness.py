"""The bench harness runs and prints its table: bench/run_all.py's goal lines, the agent-overhead bench without NVML.

No figure is asserted (the benches measure; tests do not time): only that the scripts run and say what they found.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


sys.path.insert(0, str(REPO))


@pytest.mark.needs_no_gpu  # with NVML working, bench/gpu_check.sh --overhead-only measures it
def test_agent_overhead_on_nvml_without_nvml_says_so_and_measures_nothing():
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_agent_overhead.py"), "--nvml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped, no NVML here" in result.stdout
    assert "goal" not in result.stdout  # no figure, so no verdict in `make bench`'s table
