"""Layering: the import-linter contracts in pyproject.toml hold, and a real CLI run never loads Textual."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_import_contracts_are_kept():
    # agents/ never imports console/, widgets/ or Textual; widgets/ never imports console/; the CLI, the
    # client, LabState and widgets.format never import Textual (directly or through another module);
    # screens never import CLI modules. The contracts live in pyproject.toml [tool.importlinter].
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_layers_inside_agents_refuse_a_core_module_on_a_component_and_a_component_on_anothers_internals(tmp_path):
    """The layers contract bites: in a copy of the tree where the store (core) imports the alerts component and alerts
    imports notify's sender (not its port), lint-imports breaks the contract and names both imports."""
    for package in ("agents", "console", "widgets"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "agents" / "runtime" / "store.py").open("a") as f:
        f.write("\nimport agents.alerts.component  # noqa: E402\n")
    with (tmp_path / "agents" / "alerts" / "component.py").open("a") as f:
        f.write("\nfrom agents.notify import sender  # noqa: E402\n")
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode != 0, result.stdout
    assert "agents.runtime.store -> agents.alerts.component" in result.stdout, result.stdout
    assert "agents.alerts.component -> agents.notify.sender" in result.stdout, result.stdout


def test_a_cli_verb_runs_without_textual(small_demo):
    # Static contracts cannot see a verb module imported by name at run time: run one and look.
    code = (
        "import json, sys\n"
        "from console.cli.main import build_parser, main\n"
        "build_parser()\n"
        f"code = main(['--lab', {str(small_demo.lab_path)!r}, '--json', 'status'])\n"
        "print(json.dumps({'exit': code, 'textual': sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'textual_plotext')),\n"
        "                  'asyncssh': 'asyncssh' in sys.modules}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    status, _, verdict = result.stdout.rpartition('\n{"exit"')
    verdict = json.loads('{"exit"' + verdict)
    # with an OpenSSH client on PATH a one-shot verb rides it, and asyncssh (a third of a cold start) is never loaded
    assert verdict == {"exit": 0, "textual": [], "asyncssh": shutil.which("ssh") is None}
    machines = json.loads(status)["machines"]
    assert [m["name"] for m in machines] == ["box"] and machines[0]["online"] and machines[0]["gpus"]


def test_an_agent_without_the_gateway_does_not_load_aiohttp():
    """Only the gateway's machine serves HTTP: every other agent stays ~10 MB lighter (issue 10's RSS goal)."""
    code = (
        "import sys; from agents.shell.agent import Agent; "
        "import agents.alerts.component, agents.audit.component, agents.costs.component, agents.jobs.component, agents.checkpoints, agents.orchestra, "
        "agents.shell.metrics, agents.gateway.component, agents.shell.server, agents.notify.component, agents.notify.watch; "
        "print('aiohttp' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr
