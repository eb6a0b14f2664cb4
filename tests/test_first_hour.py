"""The first hour of a new user (issue 13): the CLI's rough edges, `make bench`, the demo's own lab file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from console.cli import main as cli_main
from console.cli_models import rotation_human
from console.demo import DemoLab

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
FAST = {"load_s": 0.2, "warmup_s": 0.3, "wake_s": 0.1, "tokens_per_s": 400, "placeholder_mib": 2}

pytestmark = pytest.mark.timeout(180)


def sim_model(name: str, gpu: int) -> dict:
    return {"name": name, "path": f"models/{name}", "engine": "sim", "machine": "box", "gpus": [gpu], "vram_gib": 4, "sim": FAST}


@pytest.fixture(scope="module")
def box_lab(tmp_path_factory):
    """One machine with two sim models on a 4 h rotation and a trainer that prints a line: its agent running."""
    root = tmp_path_factory.mktemp("first-hour")
    data = {
        "lab": "first-hour",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}] * 2}}],
        "models": [sim_model("a", 0), sim_model("b", 1)],
        "orchestra": {"warm": ["a"], "rotate_every": "4h", "rotation": [["b"], ["a"]]},
        "trainers": [{"name": "hello", "machine": "box", "command": [PY, "-c", "print('hello')"], "output_dir": "runs/{job_id}"}],
    }
    (root / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(root / "run", source=root / "lab.yaml") as demo:
        yield demo


def cli(lab: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "console.cli", "--lab", str(lab), *args], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------- 8: --timeout


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_cannot_wait_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "--timeout", value, "status"])
    assert info.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_wait_timeout_of_models_must_be_positive_too(capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "warm", "a", "--wait-timeout", "0"])
    assert info.value.code == 2 and "--wait-timeout" in capsys.readouterr().err


# ---------------------------------------------------------------------------- 9, 18: rotation in words


def test_rotate_says_what_moved_in_lines_and_durations_in_hours(box_lab):
    done = cli(box_lab.lab_path, "rotate")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "{" not in out and "'swaps'" not in out  # no raw Python dicts
    assert re.search(r"^box: rotated to set 1 of 2 \(b\) in \d+\.\d s", out, re.M), out
    assert "brought up: b" in out or "swapped a out for b" in out or "freed: a" in out, out
    assert re.search(r"next in 3h5\dm, overhead \d+\.\d{3}% \(target < 1", out), out  # 4 h, not "in 14399 s"
    as_json = cli(box_lab.lab_path, "--json", "rotate", "--no-wait")
    assert json.loads(as_json.stdout)["box"]["plan"] == [["b"], ["a"]]  # --json stays JSON
    models = cli(box_lab.lab_path, "models")
    assert re.search(r"box: rotation step \d of 2, next in [34]h\d\dm", models.stdout), models.stdout
    assert not re.search(r"in \d+ s", models.stdout)


def test_rotation_text_names_problems_and_what_is_not_warm():
    rotation = {"plan": [["x", "y"], ["z"]], "index": 0, "running": False, "next_at": 1000.0 + 90, "pinned": ["p"],
                "overhead_pct": 0.0123, "target_pct": 1.0,
                "last": {"t": 1000.0 - 3600, "index": 0, "duration_s": 2.5, "swaps": [["z", "x"]], "out": [], "up": ["y"],
                         "not_warm": ["y"], "problems": ["y needs 4.5 GiB on GPU 1 of m5"]}}
    text = rotation_human({"m5": rotation}, now=1000.0)
    assert text.splitlines() == [
        "m5: rotated to set 1 of 2 (x, y) in 2.5 s, 1h00m ago",
        "  swapped z out for x",
        "  brought up: y",
        "  NOT WARM: y",
        "  problem: y needs 4.5 GiB on GPU 1 of m5",
        "  pinned (never rotated out): p",
        "  next in 1m30s, overhead 0.012% (target < 1.0%)",
    ]


# ---------------------------------------------------------------------------- 11, 12: pin, jobs


def test_unpin_says_it_is_unpinned(box_lab):
    pinned = cli(box_lab.lab_path, "pin", "a")
    assert pinned.returncode == 0 and pinned.stdout.startswith("a pinned: rotation never takes it out"), pinned.stdout
    unpinned = cli(box_lab.lab_path, "pin", "a", "--unpin")
    assert unpinned.returncode == 0 and unpinned.stdout.startswith("a unpinned: rotation may take it out"), unpinned.stdout
    assert "PINNED" not in unpinned.stdout


def test_jobs_has_a_machine_column(box_lab):
    started = cli(box_lab.lab_path, "train", "hello", "--follow")
    assert started.returncode == 0, started.stderr
    listed = cli(box_lab.lab_path, "jobs", "--all")
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["JOB", "MACHINE", "RECIPE"]
    assert any(row.split()[1:3] == ["box", "hello"] for row in rows), listed.stdout


# ---------------------------------------------------------------------------- 7: alerts --ack


@pytest.mark.parametrize("alert_id, says", [
    ("nosuch", "no alert 'nosuch' in first-hour: alert ids look like box-12"),
    ("ghost-3", "no alert 'ghost-3' in first-hour"),
    ("box-offline", "box-offline is raised by this console, not an agent"),
    ("box-999999", "no alert 'box-999999' on box"),
])
def test_acking_an_unknown_alert_names_the_alert(box_lab, alert_id, says):
    result = cli(box_lab.lab_path, "alerts", "--ack", alert_id)
    assert result.returncode == 1
    assert says in result.stderr, result.stderr
    assert "no machine named" not in result.stderr


# ---------------------------------------------------------------------------- 2: make bench


@pytest.mark.slow
def test_the_supervised_training_bench_runs_without_the_venv_on_path(tmp_path):
    """`make bench` runs .venv/bin/python bench/...: the venv's bin folder is not on PATH."""
    venv_bin = str(Path(PY).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != venv_bin)
    env = {**os.environ, "PATH": path, "TMPDIR": str(tmp_path)}
    result = subprocess.run([PY, "bench/bench_train_supervised.py", "--steps", "4", "--rounds", "1"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["bare_steps_per_s"] > 0 and figures["supervised_steps_per_s"] > 0
