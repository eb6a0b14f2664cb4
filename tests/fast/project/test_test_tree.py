"""The tests' own shape: a test module imports no other test module, and imports no fixture (tests/support/'s
fixtures are registered once, in conftest's pytest_plugins, so one a fixture stands on cannot go missing)."""

from __future__ import annotations

import ast

from tests import conftest
from tests.support.lab import REPO

TESTS = REPO / "tests"


def _fixture_modules() -> set[str]:
    found = set()
    for path in (TESTS / "support").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                "fixture" in ast.unparse(d) for d in node.decorator_list
            ):
                found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def _fixtures_in(module: str) -> set[str]:
    path = REPO.joinpath(*module.split(".")).with_suffix(".py")
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            "fixture" in ast.unparse(d) for d in node.decorator_list
        ):
            names.add(node.name)
    return names


def test_every_support_module_with_fixtures_is_a_plugin_and_no_test_imports_a_fixture():
    modules = _fixture_modules()
    assert modules == set(conftest.pytest_plugins), modules ^ set(conftest.pytest_plugins)
    fixtures = set().union(*(_fixtures_in(m) for m in modules))
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                if node.module and not node.module.startswith("tests.support"):
                    offenders.append(f"{path.relative_to(TESTS)} imports the test module {node.module}")
                offenders += [f"{path.relative_to(TESTS)} imports the fixture {a.name}" for a in node.names if a.name in fixtures]
    assert not offenders, offenders
