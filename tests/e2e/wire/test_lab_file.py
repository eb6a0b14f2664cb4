"""lab.yaml: the demo lab loads; every error names file, line and key path, never a traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.support.lab_file import GOOD_MACHINE


def test_cli_reports_a_bad_lab_without_traceback(tmp_path):
    bad = tmp_path / "lab.yaml"
    bad.write_text(GOOD_MACHINE.replace("tdp_w: 75", "tdp_w: -1"))
    result = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(bad), "status"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"{bad}:7: machines[0].gpus.sim[0].tdp_w: Input should be greater than 0" in result.stderr
    assert "Traceback" not in result.stderr
