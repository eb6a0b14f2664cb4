"""`make demo`: the demo lab lives in the checkout, a second run keeps runs, checkpoints and keys, one demo per
folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from tests.support.cli_labs import cli, saver_lab
from tests.support.waits import wait_until

REPO = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.timeout(180)


def wait_cli(lab: Path, args: list[str], done, timeout: float = 60.0):
    """Run a `cetlab --json` command until done(its JSON) holds (the agents poll their folders every poll_s)."""

    def met() -> dict | None:
        result = cli(lab, "--json", *args)
        data = json.loads(result.stdout) if result.returncode == 0 else None
        return data if data is not None and done(data) else None

    return wait_until(met, timeout=timeout, interval=0.2, what=f"cetlab --json {' '.join(args)}")


def test_the_demo_lab_lives_in_the_checkout_and_git_ignores_it():
    from console.lab.demo import default_demo_dir

    assert default_demo_dir() == REPO / ".cetlab-demo"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(REPO / ".cetlab-demo" / "lab.yaml")], cwd=REPO)
    assert ignored.returncode == 0, ".cetlab-demo/ must be git-ignored"


def test_make_demo_twice_keeps_runs_checkpoints_and_keys(tmp_path, monkeypatch, capsys):
    """`cetlab-console --demo` (make demo) twice on its known folder: what the first made, the second lists."""
    import console.lab.demo
    import console.tui.app

    demo_dir = tmp_path / "kept"
    source = saver_lab(tmp_path / "src")
    monkeypatch.setattr(console.lab.demo, "default_demo_dir", lambda: demo_dir)
    seen: list[dict] = []

    def first_session(app) -> None:  # the operator trains in the console; here through the CLI on the same lab file
        assert cli(app.lab.source, "train", "saver", "--follow").returncode == 0
        seen.append(wait_cli(app.lab.source, ["checkpoints"], lambda d: any(r["newest_step"] == 2 for r in d["runs"])))

    def second_session(app) -> None:
        seen.append(
            {
                "jobs": wait_cli(app.lab.source, ["jobs", "--all"], lambda d: bool(d["jobs"]))["jobs"],
                "runs": wait_cli(app.lab.source, ["checkpoints"], lambda d: bool(d["runs"]))["runs"],
                "port": app.lab.machines[0].port,
            }
        )

    monkeypatch.setattr(console.tui.app.CetlabApp, "run", first_session)
    assert console.tui.app.main(["--demo", "--lab", str(source)]) == 0
    host_key = (demo_dir / "agents" / "box" / "ssh_host_ed25519_key.pub").read_bytes()
    first_port = yaml.safe_load((demo_dir / "lab.yaml").read_text())["machines"][0]["port"]
    quit_text = capsys.readouterr().out
    assert f"--lab {demo_dir / 'lab.yaml'} status" in quit_text  # the line to use against it, printed on quit
    assert (demo_dir / "lab.yaml").exists()  # kept: not a temp folder deleted on quit
    # a demo that died leaves its lock file (and the agents their pid files): a new start is not stopped by them
    (demo_dir / "demo.lock").write_text("999999\n")

    monkeypatch.setattr(console.tui.app.CetlabApp, "run", second_session)
    assert console.tui.app.main(["--demo", "--lab", str(source)]) == 0
    (run,) = seen[0]["runs"]
    assert [j["id"] for j in seen[1]["jobs"]] == [run["job"]] and seen[1]["jobs"][0]["state"] == "exited"
    assert [(r["run"], r["newest_step"]) for r in seen[1]["runs"]] == [(run["run"], 2)]
    assert (demo_dir / "agents" / "box" / "ssh_host_ed25519_key.pub").read_bytes() == host_key  # the same keys
    assert isinstance(seen[1]["port"], int) and seen[1]["port"] > 0 and first_port > 0  # fresh ports, written each start


def test_one_demo_per_folder_at_a_time(tmp_path, monkeypatch, capsys):
    import console.lab.demo
    import console.tui.app
    from agents.shell.demo.lab import DemoRunningError

    source = saver_lab(tmp_path / "src")
    with DemoLab(tmp_path / "d", source=source) as running:
        port = running.lab_path.read_text()
        with pytest.raises(DemoRunningError, match=r"already running from .* \(pid \d+\); use it: .*--lab .*lab.yaml status"):
            DemoLab(tmp_path / "d", source=source).start()
        monkeypatch.setattr(console.lab.demo, "default_demo_dir", lambda: tmp_path / "d")
        assert console.tui.app.main(["--demo", "--lab", str(source)]) == 1  # a second `make demo`
        said = capsys.readouterr()
        assert f"already running from {tmp_path / 'd'} (pid {os.getpid()})" in said.err and "stopped" not in said.out
        assert running.lab_path.read_text() == port  # the running demo's ports were not rewritten
    again = DemoLab(tmp_path / "d", source=source)  # stopped: the folder is free again
    again.lock()
    again.unlock()


def test_the_source_lab_says_which_file_the_demo_uses():
    from console.lab.demo import bundled_lab

    result = cli(bundled_lab(), "--timeout", "1", "status")
    assert result.returncode == 0  # status: the lab loaded, whatever the machines say
    assert "is the demo lab's source" in result.stderr
    assert (
        "--lab .cetlab-demo/lab.yaml status" in result.stderr
        or f"--lab {REPO / '.cetlab-demo' / 'lab.yaml'} status" in result.stderr
    )


def test_the_help_screen_can_ask_for_the_demo_cli_line(tmp_path):
    from console.lab.demo import demo_cli_hint

    with DemoLab(tmp_path / "d", source=saver_lab(tmp_path / "src")) as demo:
        assert demo_cli_hint(demo.lab_path).endswith(f"--lab {demo.lab_path} status")
    assert demo_cli_hint(tmp_path / "src" / "lab.yaml") is None  # not a demo's lab file
    assert demo_cli_hint(None) is None
