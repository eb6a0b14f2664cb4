"""The first hour of a new user (issue 13): the CLI's rough edges, `make bench`, the demo's own lab file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.sections.models import Rotation
from console.cli.main import main as cli_main
from console.cli.models import rotation_human
from tests.conftest import wait_until

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
    return subprocess.run(
        [PY, "-m", "console.cli.main", "--lab", str(lab), *args], capture_output=True, text=True, timeout=timeout
    )


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
    # 4 h, not "in 14399 s"; a first rotation minutes after the start is seconds, not an alarming share of those minutes
    assert re.search(
        r"next in 3h5\dm, \d+\.\d s without models in \S+ \(overhead judged after one 4h00m period; target < 1%\)", out
    ), out
    as_json = cli(box_lab.lab_path, "--json", "rotate", "--no-wait")
    assert json.loads(as_json.stdout)["box"]["plan"] == [["b"], ["a"]]  # --json stays JSON
    models = cli(box_lab.lab_path, "models")
    assert re.search(r"box: rotation step \d of 2, next in [34]h\d\dm", models.stdout), models.stdout
    assert not re.search(r"in \d+ s", models.stdout)


def test_rotation_text_names_problems_and_what_is_not_warm():
    rotation = {
        "plan": [["x", "y"], ["z"]],
        "index": 0,
        "running": False,
        "next_at": 1000.0 + 90,
        "pinned": ["p"],
        "overhead_pct": 0.0123,
        "target_pct": 1.0,
        "last": {
            "t": 1000.0 - 3600,
            "index": 0,
            "duration_s": 2.5,
            "swaps": [["z", "x"]],
            "out": [],
            "up": ["y"],
            "not_warm": ["y"],
            "problems": ["y needs 4.5 GiB on GPU 1 of m5"],
        },
    }
    text = rotation_human({"m5": Rotation.model_validate(rotation)}, now=1000.0)
    assert text.splitlines() == [
        "m5: rotated to set 1 of 2 (x, y) in 2.5 s, 1h00m ago",
        "  swapped z out for x",
        "  brought up: y",
        "  NOT WARM: y",
        "  problem: y needs 4.5 GiB on GPU 1 of m5",
        "  pinned (never rotated out): p",
        "  next in 1m30s, overhead 0.012% (target < 1%)",
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


@pytest.mark.parametrize("alert_id", ["nosuch", "box-1", "box-12", "box#", "#3", "box#x"])
def test_an_alert_id_that_is_not_one_is_a_usage_error(alert_id, capsys):
    """An alert id is "<machine>#<n>": a job id (box-1) or a typo is refused before anything is asked, naming the form."""
    with pytest.raises(SystemExit) as info:
        cli_main(["--lab", "nowhere.yaml", "alerts", "--ack", alert_id])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{alert_id!r} is not an alert id: alert ids are <machine>#<n>, e.g. m5#12" in err, err
    assert "no machine named" not in err


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


# ---------------------------------------------------------------------------- 2: make bench


@pytest.mark.slow
def test_the_supervised_training_bench_runs_without_the_venv_on_path(tmp_path):
    """`make bench` runs .venv/bin/python bench/...: the venv's bin folder is not on PATH."""
    venv_bin = str(Path(PY).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != venv_bin)
    env = {**os.environ, "PATH": path, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [PY, "bench/bench_train_supervised.py", "--steps", "4", "--rounds", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["bare_steps_per_s"] > 0 and figures["supervised_steps_per_s"] > 0


# ---------------------------------------------------------------------------- 13: the demo's lab file, kept

SAVER = """import json, pathlib, sys
ckpt = pathlib.Path(sys.argv[1]) / "checkpoint-2"
ckpt.mkdir(parents=True)
(ckpt / "adapter_model.safetensors").write_bytes(b"weights")
(ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": [{"step": 2, "loss": 1.5}]}))
print("saved", ckpt)
"""


def saver_lab(root: Path) -> Path:
    """A one-machine demo source whose trainer writes one checkpoint (real files) and exits."""
    data = {
        "lab": "kept-lab",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "trainers": [
            {"name": "saver", "machine": "box", "command": [PY, "-c", SAVER, "{output_dir}"], "output_dir": "runs/{job_id}"}
        ],
        "checkpoints": {"poll_s": 1, "settle_s": 0},
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "lab.yaml"


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


# ---------------------------------------------------------------------------- 1: `cetlab warm` during the start plan


@pytest.fixture()
def plan_lab(tmp_path):
    """One machine whose start plan brings model p up and then puts it to sleep (slow enough to ask during it)."""
    slow = {**FAST, "load_s": 4.0, "cold_factor": 1.0}
    data = {
        "lab": "start-plan",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "models": [{**sim_model("p", 0), "sim": slow}],
        "orchestra": {"sleeping": ["p"]},
    }
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with DemoLab(tmp_path / "run", source=tmp_path / "lab.yaml") as demo:
        yield demo


def test_an_operators_warm_wins_over_the_start_plans_sleep(plan_lab):
    done = cli(plan_lab.lab_path, "warm", "p", "--wait-timeout", "60")
    assert done.stderr.startswith("p: loading"), done.stderr  # asked while the start plan was bringing it up
    assert done.returncode == 0, done.stderr  # before: the plan put it to sleep and the wait hung to its timeout
    assert done.stdout.startswith("p on box GPU 0: warm"), done.stdout
    after = json.loads(cli(plan_lab.lab_path, "--json", "models").stdout)
    assert [m["state"] for m in after["models"]] == ["warm"]


class ScriptedModels:
    """A CLI context whose models.get answers a script of states, the last one repeated (the wait's logic alone)."""

    def __init__(self, states: list[tuple[str, str | None]]):
        self.states = states
        self.args = type("Args", (), {"json": False})()
        self.lab = type("Lab", (), {"models": [type("M", (), {"name": "p", "machine": "box", "replicas": []})()], "lab": "x"})()

    async def call(self, machine, method, params, timeout=None):
        state, op = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        history = [{"t": 0.0, "event": "sleep", "from_state": "warm", "to_state": "sleeping", "detail": None}]
        return {
            "name": "p",
            "machine": "box",
            "engine": "sim",
            "since": 0.0,
            "path": "models/p",
            "gpus": [0],
            "state": state,
            "op": op,
            "history": history,
        }

    async def request(self, machine, method, params, timeout=None):
        from agents.wire.catalogue.method import validate_reply

        return validate_reply(method, await self.call(machine, method.name, params, timeout))


def test_a_wait_for_warm_ends_when_the_model_settles_asleep_and_says_why(capsys):
    from console.cli.models import SettledElsewhere, wait_settled

    ctx = ScriptedModels([("loading", "warm"), ("warm", "sleep"), ("sleeping", None)])
    with pytest.raises(SettledElsewhere) as info:
        asyncio.run(wait_settled(ctx, "p", ("warm",), timeout_s=30))
    assert "p settled sleeping, not warm: its last move was sleep (warm → sleeping)" in info.value.message


# ---------------------------------------------------------------------------- 11: cut and odd text


def test_a_phase_that_repeats_the_state_is_said_once():
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import state_text
    from widgets.orchestra_table import COLUMNS, state_cell

    loading = {"name": "m", "machine": "box", "engine": "sim", "state": "loading", "since": 0.0}
    assert state_text(ModelInfo(**loading, progress={"phase": "loading"})) == "loading"
    assert state_text(ModelInfo(**loading, progress={"phase": "warm-up"})) == "loading (warm-up)"
    assert str(state_cell(ModelInfo(**loading, progress={"phase": "loading"}))) == "loading"
    tiny = str(state_cell(ModelInfo(**loading, progress={"phase": "making the tiny model"})))
    assert tiny == "loading making the tiny model"
    from widgets.live_table import LiveTable
    from widgets.orchestra_table import DROP, STATE_MIN

    table = LiveTable(COLUMNS, lambda item: item, DROP, rest_min=STATE_MIN)  # STATE is the column for the rest
    state_width = 158 - sum((COLUMNS[i][2] or 0) + 2 for i in table.columns_for(158)) - 1
    assert len(tiny) <= state_width, state_width


def test_the_step_cell_keeps_its_percent():
    from agents.wire.sections.jobs import JobInfo
    from tests.console_fixtures import frozen_jobs
    from widgets.jobs_table import COLUMNS, step_cell

    width = dict((k, w) for k, _, w in COLUMNS)["step"]
    for step, max_steps in ((2000, 2000), (1230, 100000)):
        job = JobInfo(**{**frozen_jobs()[0], "step": step, "max_steps": max_steps})
        assert step_cell(job).endswith("%") and len(step_cell(job)) <= width, step_cell(job)


def test_the_start_forms_bounds_are_written_as_numbers_people_write():
    from agents.wire.catalogue.jobs import RecipeParam
    from console.tui.screens.modals import param_hint

    hint = param_hint(RecipeParam(name="max_steps", type="int", min=1.0, max=100000.0, flag="--max-steps"))
    assert "(int, 1..100000)" in hint, hint
    assert "(float, ..0.5)" in param_hint(RecipeParam(name="lr", type="float", min=None, max=0.5, flag="--lr"))


def test_one_checkpoint_is_singular_and_a_model_is_named_once_in_costs():
    from agents.wire.catalogue.checkpoints import Pruned
    from agents.wire.catalogue.costs import PricedGroup
    from agents.wire.sections.checkpoints import CheckpointInfo
    from console.cli.checkpoints import prune_human
    from console.tui.screens.costs import breakdown_rows

    one = CheckpointInfo(run="r", step=1, path="r/checkpoint-1")
    assert "deleted 1 checkpoint," in prune_human(Pruned(run="r", keep_last=0, deleted=[one], freed_bytes=10))
    entry = {
        "model": "llama-3.1-8b",
        "label": "llama-3.1-8b",
        "machine": "m5",
        "kwh": 1.0,
        "cost": 0.3,
        "cloud_equivalent": 2.0,
        "saving_pct": 85.0,
        "gpu_hours": 1.0,
        "gpu_busy_hours": 0.5,
        "tokens": 1000,
    }
    rows = breakdown_rows([PricedGroup.model_validate(entry)], "model", "EUR")
    assert rows["m5/llama-3.1-8b"][0] == "llama-3.1-8b @m5"


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


def test_the_start_forms_bounds_keep_exponents_and_minus_signs():
    """The N/A marker is "-": removing it ate 1e-06's sign and a negative minimum's ("(float, 1e06..1)")."""
    from agents.wire.catalogue.jobs import RecipeParam
    from console.tui.screens.modals import param_hint

    assert "(float, 1e-06..1)" in param_hint(
        RecipeParam(name="learning_rate", type="float", min=1e-6, max=1.0, flag="--learning-rate")
    )
    assert "(float, -2.5..)" in param_hint(RecipeParam(name="bias", type="float", min=-2.5, max=None, flag="--bias"))


def test_a_rotation_line_names_the_machines_own_models_of_the_set():
    """`cetlab rotate` said "workstation: rotated to set 2 of 2 (qwen2.5-coder-7b, mistral-7b-awq)" though none of them is there."""
    last = {"t": 900.0, "index": 1, "duration_s": 0.1, "swaps": [], "out": [], "up": [], "not_warm": [], "problems": []}
    rotation = {
        "plan": [["a"], ["qwen", "mistral", "phi"]],
        "index": 1,
        "running": False,
        "next_at": 2000.0,
        "pinned": [],
        "overhead_pct": 0.0,
        "target_pct": 1.0,
        "last": last,
    }
    typed = Rotation.model_validate(rotation)
    text = rotation_human(
        {"workstation": typed, "irina": typed}, now=1000.0, models_on={"workstation": {"tiny"}, "irina": {"mistral", "phi"}}
    )
    assert "workstation: rotated to set 2 of 2 (it has none of workstation's models) in 0.1 s" in text, text
    assert "irina: rotated to set 2 of 2 (mistral, phi) in 0.1 s" in text, text


async def test_the_header_clock_and_cost_go_on_while_a_modal_is_open():
    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.modals import HelpScreen
    from tests.conftest import until_drawn, wait_for
    from tests.console_fixtures import FROZEN_NOW, frozen_state
    from widgets.lab_header import LabHeader

    now = [FROZEN_NOW]
    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: now[0])
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        view = app.screen
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        before = str(view.query_one(LabHeader).text)
        now[0] += 75  # 1 min 15 s later, the help still open
        clock = time.strftime("%H:%M:%S", time.localtime(now[0]))
        shown = await wait_for(
            lambda: clock in str(view.query_one(LabHeader).text) and str(view.query_one(LabHeader).text), timeout=10
        )
        assert shown != before and isinstance(app.screen, HelpScreen)


def test_the_costs_plot_spans_its_days_and_names_its_window():
    """A one-day lab drew two bars as wide as the plot; the view said "since 2026-10-26" where the CLI says the month's 1st."""
    from datetime import date

    from console.lab.costs import LabDay
    from console.tui.screens.costs import PLOT_DAYS, plot_days

    today = date(2026, 11, 24)
    days = plot_days([LabDay(day="2026-11-24", api=0.0, cost=1.5, cloud_equivalent=9.0, kwh=None)], date(2026, 10, 26), today)
    assert len(days) == PLOT_DAYS and days[-1] == ("11-24", 1.5, 9.0) and days[0] == ("10-26", 0.0, 0.0)
    assert all(cost == cloud == 0.0 for _, cost, cloud in days[:-1])
    assert plot_days([], today, today) == [("11-24", 0.0, 0.0)]


def test_make_bench_ends_with_goals_met_and_missed_and_fails_on_a_miss():
    """`make bench` exited 0 whatever its goals said."""
    from bench.run_all import Outcome, summary, verdicts

    agent = verdicts(
        "bench_agent_overhead.py", ["agent - idle  :  0.30% of one core (goal < 1%: OK), RSS 70.1 MB (goal <= 64 MB: MISSED)\n"]
    )
    cli = verdicts("bench_cli.py", ["cold status 0.59 s (goal <= 0.5 s: met)\n", "a line with no verdict\n"])
    figures = verdicts("bench_attacks.py", ["agent fds 13 -> 13\n"])
    assert (len(agent.met), len(agent.missed), len(cli.met), len(cli.missed)) == (0, 1, 1, 0)
    table, status = summary([agent, cli, figures])
    assert status == 1 and "MISSED: bench_agent_overhead.py: agent - idle" in table and "figures only" in table, table
    assert summary([cli, figures])[1] == 0
    assert summary([cli, Outcome("bench_rpc.py", exit_code=1)])[1] == 2
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "bench/run_all.py" in makefile.split("bench: ", 1)[1].split("\n\n")[0]


def test_the_benchmarks_page_states_the_benches_goals_as_they_check_them():
    """The agent's RSS goal was 64 MB in its bench and 80 MB in the manual; now a ratio to the nvitop-style loop (issue 22)."""
    root = Path(__file__).resolve().parent.parent
    bench = (root / "bench" / "bench_agent_overhead.py").read_text()
    page = (root / "docs" / "benchmarks.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `bench_agent_overhead.py`"))
    rss = re.search(r"^RSS_GOAL = ([\d.]+)", bench, re.M)
    cpu = re.search(r"^CPU_GOAL = ([\d.]+)", bench, re.M)
    assert rss is not None and cpu is not None
    goals = row.rstrip(" |").rsplit("|", 1)[1]
    assert f"RSS <= {rss.group(1)}x the loop" in goals and f"CPU <= {cpu.group(1)}%" in goals, row
    assert "minutes" in page.split("# Benchmarks", 1)[1].split("| benchmark |")[0]


async def test_the_jump_placeholder_names_every_view_and_help_wraps_in_its_column():
    """The `:` placeholder was cut before audit and gateway; `?` wrapped a long description back to column 0."""
    from rich.console import Console
    from textual.widgets import Input, Static

    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.modals import HelpScreen, JumpScreen
    from console.tui.views import VIEWS
    from tests.conftest import until_drawn, wait_for
    from tests.console_fixtures import FROZEN_NOW, frozen_state

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon")
        jump = await wait_for(lambda: isinstance(app.screen, JumpScreen) and app.screen)
        await pilot.pause()
        field = jump.query_one("#jump", Input)
        assert field.content_size.width >= len(field.placeholder) and all(name in field.placeholder for name in VIEWS)
        await pilot.press("escape")
        long = "resume a run from the selected checkpoint with the params it ran with, each of them changeable before it starts"
        app.push_screen(HelpScreen([("r", long)]))
        help_screen = await wait_for(lambda: isinstance(app.screen, HelpScreen) and app.screen)
        await pilot.pause()
        console = Console(width=help_screen.query_one(Static).content_size.width, record=True, color_system=None)
        console.print(help_screen.query_one(Static).content)
        lines = console.export_text().splitlines()
        first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("r "))
        assert lines[first + 1].startswith(" " * 12) and lines[first + 1].strip(), lines[first : first + 3]


def test_a_bad_name_is_refused_in_words_not_with_the_pattern():
    """`cetlab gateway keys add 'bad name!'` printed pydantic's raw regular expression."""
    from pydantic import ValidationError

    from agents.runtime.rpc import _params_error
    from agents.wire.catalogue.gateway import KeyAddParams

    with pytest.raises(ValidationError) as info:
        KeyAddParams.model_validate({"name": "bad name!"})
    message = _params_error(info.value)
    assert (
        message
        == "name: 'bad name!' is not a name: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64"
    )
    assert "^[" not in message


def test_the_benches_say_what_they_measure():
    """Issue 23 item 16: "data age on screen" was the state's age at each tick; the streaming ratio compared two engine-paced
    streams; the rotation overhead was mostly assumed delays. Each line now says which."""
    root = Path(__file__).resolve().parent.parent
    scale = (root / "bench" / "bench_console_scale.py").read_text()
    assert "data age as drawn (at each paint" in scale and "as it arrived, not as drawn" in scale  # issue 22: from what was drawn
    gateway = (root / "bench" / "bench_gateway.py").read_text()
    assert "both paced by the engine" in gateway and "not its ceiling" in gateway
    orchestra = (root / "bench" / "bench_orchestra.py").read_text()
    assert "assumed: the field notes' engine delays" in orchestra and "measured: the rotation took" in orchestra
    page = (root / "docs" / "benchmarks.md").read_text()
    assert "data age on screen" not in page and "assumed, not measured" in page and "keeps pace with it" in page


async def test_the_machine_detail_gives_its_charts_the_rows_it_has():
    """Two-row charts on a 50-row screen before: the GPU panels now share the view's height."""
    from console.lab.client import FleetClient
    from console.tui.app import CetlabApp
    from console.tui.screens.machine import MachineScreen
    from tests.conftest import until_drawn, wait_for
    from tests.console_fixtures import FROZEN_NOW, frozen_state
    from widgets.gpu_panel import GpuPanel

    state = frozen_state()
    app = CetlabApp(state.lab, client=FleetClient(state.lab, state), connect=False, clock=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 50)) as pilot:
        await until_drawn(pilot)
        app.push_screen(MachineScreen("irina"))  # two GPUs
        screen = await wait_for(
            lambda: isinstance(app.screen, MachineScreen) and len(app.screen.query(GpuPanel)) == 2 and app.screen
        )
        await pilot.pause()
        heights = [chart.size.height for chart in screen.query("ScaleChart")]
        assert heights and min(heights) >= 6, heights


def test_the_agents_start_line_says_no_gpus_in_words_and_a_cpu_model_is_on_its_cpu():
    from agents.shell.agent import gpus_said
    from agents.wire.sections.models import ModelInfo
    from console.cli.models import model_human

    assert gpus_said("none", "no GPUs (lab.yaml says gpus: none)") == "no GPUs (lab.yaml says gpus: none)"
    assert gpus_said("nvml", "no NVIDIA GPUs: the driver reports none") == "no NVIDIA GPUs: the driver reports none"
    assert gpus_said("nvml", None) == "nvml GPUs: ok" and gpus_said("sim", "ok") == "sim GPUs: ok"
    cpu = ModelInfo(name="tiny", machine="box", engine="transformers", state="warm", since=0.0, gpus=[])
    assert model_human(cpu).startswith("tiny on box CPU: "), model_human(cpu)
    assert model_human(cpu.model_copy(update={"gpus": [0, 1]})).startswith("tiny on box GPU 0,1: ")
