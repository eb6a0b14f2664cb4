"""What the CLI's verbs say against a running lab: unpin, the jobs table, an unknown alert, a reader that leaves,
Ctrl-C."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.support.cli_labs import (
    PY,
    cli,
)

pytestmark = pytest.mark.timeout(180)


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


@pytest.mark.parametrize(
    "alert_id, says",
    [
        ("ghost#3", "no alert 'ghost#3' in first-hour: there is no machine 'ghost' (machines: box)"),
        ("box#offline", "box#offline is raised by this console, not an agent"),
        ("box#999999", "no alert 'box#999999' on box"),
    ],
)
def test_acking_an_unknown_alert_names_the_alert(box_lab, alert_id, says):
    result = cli(box_lab.lab_path, "alerts", "--ack", alert_id)
    assert result.returncode == 1
    assert says in result.stderr, result.stderr
    assert "no machine named" not in result.stderr


# ---------------------------------------------------------------------------- the entry point's ways out


def test_a_reader_that_leaves_mid_output_gets_no_traceback(tmp_path):
    """`cetlab --json status | head -c 10`: more output than a pipe buffer, the reader gone, no traceback, 141."""
    machines = [
        {"name": f"m{i}", "port": 1, "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}} for i in range(80)
    ]
    lab = tmp_path / "lab.yaml"
    lab.write_text(yaml.safe_dump({"lab": "wide", "machines": machines, "console": {"key": "absent_key"}}, sort_keys=False))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the first byte
    try:
        result = subprocess.run(
            [PY, "-c", "from console.cli.entry import entry; entry()", "--lab", str(lab), "--json", "status"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=dict(os.environ, CETLAB_SSH="asyncssh"),
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and result.returncode == 141, result.stderr


def test_a_ctrl_c_before_the_verb_runs_exits_130_without_a_traceback(monkeypatch):
    import gc

    import console.cli.main
    from console.cli import entry as cli_entry

    def interrupted():
        raise KeyboardInterrupt  # as a Ctrl-C lands while the verbs' modules are imported for the parser

    def exit_with(code):
        raise SystemExit(code)

    monkeypatch.setattr(console.cli.main, "build_parser", interrupted)
    monkeypatch.setattr(cli_entry.os, "_exit", exit_with)
    try:
        with pytest.raises(SystemExit) as info:
            cli_entry.entry()
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C went on to the interpreter, which prints a traceback")
    finally:
        gc.unfreeze()
    assert info.value.code == 130
