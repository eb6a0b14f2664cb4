"""mypy ([tool.mypy] in pyproject.toml: strict on agents/, console/ and widgets/, every test body checked in tests/), and
ruff's lint and format check: zero errors."""

from __future__ import annotations

import subprocess
import sys

from tests.support.lab import REPO


def test_agents_console_and_widgets_pass_mypy():
    # incremental: `make test` has just run mypy, so its cache is warm (a stale cache is mypy's own concern to refresh)
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_ruff_lint_and_format_pass():
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout[-4000:] + lint.stderr[-2000:]
    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert fmt.returncode == 0, fmt.stdout[-4000:] + fmt.stderr[-2000:]
