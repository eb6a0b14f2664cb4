"""mypy in strict mode on agents/, console/ and widgets/ ([tool.mypy] in pyproject.toml), and ruff's lint and format check: zero errors."""

from __future__ import annotations

from tests.support.lab import REPO


def test_mypy_runs_in_strict_mode_over_the_three_packages():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert config["files"] == ["agents", "console", "widgets"]
    assert "overrides" not in config  # no module is exempt
