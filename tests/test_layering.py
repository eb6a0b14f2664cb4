"""Layering: agents/ never imports console/, widgets/ or Textual; widgets/ never imports console/."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def modules_of(package: str) -> list[str]:
    root = REPO / package
    names = [package]
    for info in pkgutil.walk_packages([str(root)], prefix=f"{package}."):
        if not info.name.endswith("__main__"):  # importing it would run it
            names.append(info.name)
    return names


def imported_after(modules: list[str]) -> set[str]:
    """Import the modules in a fresh interpreter; return every top-level package then loaded."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def test_agents_never_import_console_widgets_or_textual():
    # The trainer (agents.train) pulls in torch, not Textual; it is checked like the rest.
    loaded = imported_after(modules_of("agents"))
    assert not loaded & {"console", "widgets", "textual"}, loaded & {"console", "widgets", "textual"}


def test_widgets_never_import_console():
    loaded = imported_after(modules_of("widgets"))
    assert "console" not in loaded


def test_client_and_state_have_no_textual():
    loaded = imported_after(["console.client", "console.state", "console.cli"])
    assert "textual" not in loaded
