"""mypy in strict mode on agents/, console/ and widgets/, the tests' bodies checked ([tool.mypy] in pyproject.toml),
and ruff's lint and format check: zero errors."""

from __future__ import annotations

import tomllib

from tests.support.lab import REPO


def _mypy() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]


def test_mypy_runs_in_strict_mode_over_the_three_packages_and_checks_the_tests():
    config = _mypy()
    assert config["strict"] is True
    assert config["files"] == ["agents", "console", "widgets", "tests"]
    overrides = config.get("overrides", [])
    for override in overrides:  # no product module is exempt: only tests loosen, and only tests sit on the ratchet
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        assert all(m == "tests.*" or m.startswith("tests.") for m in modules), modules
    loosened = [o for o in overrides if o["module"] == ["tests.*"] or o["module"] == "tests.*"]
    assert loosened and loosened[0]["check_untyped_defs"] is True  # a test's body is checked even without annotations
