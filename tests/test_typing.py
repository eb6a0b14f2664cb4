"""mypy on agents/, console/ and widgets/ ([tool.mypy] in pyproject.toml: its strictness and the overrides): zero errors."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_agents_console_and_widgets_pass_mypy():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
