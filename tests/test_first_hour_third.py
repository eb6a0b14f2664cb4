"""The first hour, third pass (issue 32): a multi-node job's name and start, the words of the views and the CLI."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from agents.wire.catalogue.jobs import RecipeInfo
from agents.wire.events import LogEvent
from agents.wire.sections.jobs import JobDetail
from console.cli import jobs as cli_jobs
from console.cli.jobs import follow, job_human, jobs_human
from console.tui.screens.modals import StartJobScreen
from tests.test_checkpoints_console import frozen_app  # noqa: F401  (a fixture)
from widgets.format import placement

NODES = [{"machine": "m5", "gpus": [], "state": "starting"}, {"machine": "irina", "gpus": [], "state": "starting"}]


def ddp_job(**changes: Any) -> JobDetail:
    job = {
        "id": "m5-2",
        "recipe": "ddp-2node",
        "machine": "m5",
        "state": "starting",
        "started_at": 1.0,
        "output_dir": "runs/m5-2",
        "log_path": "logs/job-m5-2.log",
        "nodes": NODES,
    }
    return JobDetail.model_validate({**job, **changes})


def test_a_multi_node_job_and_recipe_are_named_by_their_machines_as_jobs_does():
    job = ddp_job()
    assert job_human(job).splitlines()[0] == "job m5-2 (ddp-2node) on m5+irina: starting"  # was "on m5 GPU -"
    assert "m5+irina" in jobs_human([job], {}).splitlines()[1]
    recipe = RecipeInfo(name="ddp-2node", machine="m5", nodes=["m5", "irina"], launcher="torchrun", output_dir="o")
    assert placement(recipe.machine, recipe.gpus, recipe.nodes) == "m5+irina"
    assert "on m5+irina (torchrun" in StartJobScreen(recipe).heading()
    single = RecipeInfo(name="lora", machine="m5", gpus=[0, 1], output_dir="o")
    assert StartJobScreen(single).heading().startswith("start [b]lora[/b] on m5 GPU 0,1")


async def test_follow_says_the_nodes_while_they_start(monkeypatch, capsys):
    """torchrun's imports and rendezvous print nothing for a while: the nodes' states are said when they change."""
    monkeypatch.setattr(cli_jobs, "FOLLOW_POLL_S", 0.01)
    steps = [
        ddp_job(),
        ddp_job(),  # unchanged: said once
        ddp_job(nodes=[{**NODES[0], "state": "running"}, NODES[1]]),
        ddp_job(state="running", nodes=[{**n, "state": "running"} for n in NODES]),
    ]

    class Client:
        on_event: Any = None

        async def call(self, machine: str, method: str, params: Any, timeout: float | None = None) -> Any:
            if method == "jobs.logs":
                return {"id": "m5-2", "path": "log", "lines": [], "offset": 0, "state": "starting"}
            assert method == "jobs.get"
            job = steps.pop(0)
            if not steps:  # the trainer speaks, then ends
                for event in (
                    LogEvent(job="m5-2", lines=["cetlab-train: step 1/4"], offset=1),
                    LogEvent(job="m5-2", offset=2, ended=True, state="exited", exit_code=0),
                ):
                    asyncio.get_running_loop().call_soon(self.on_event, "m5", "log", event)
            return job.to_wire()

    ctx = SimpleNamespace(
        client=Client(),
        args=argparse.Namespace(json=False),
        state=SimpleNamespace(machines={"m5": SimpleNamespace(online=True)}),
    )
    assert await follow(ctx, "m5", "m5-2", 0, offset=0) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line.split(": ", 1)[1] for line in lines if line.startswith("waiting for the nodes")]
    assert said == ["m5 starting, irina starting", "m5 running, irina starting"], lines
    assert lines[-1] == "cetlab-train: step 1/4"


def test_a_saving_far_below_minus_100_percent_is_said_as_times_the_cloud():
    """A tiny cloud equivalent against idle power gave "-1276%"."""
    from widgets.format import fmt_saving

    assert [fmt_saving(p) for p in (70.0, -40.0, -1276.0, None)] == ["70%", "-40%", "14x cloud", "-"]


def test_the_overhead_of_a_first_rotation_is_seconds_until_a_period_has_passed():
    from agents.wire.sections.models import Rotation
    from console.cli.models import rotation_schedule
    from console.tui.screens.models import rotation_text

    early = Rotation(plan=[["a"], ["b"]], every_s=600, unavailable_s=21.0, wall_s=300, overhead_pct=7.0, target_pct=1.0)
    said = rotation_schedule(early, 0.0)
    assert said.endswith("21.0 s without models in 5m00s (overhead judged after one 10m00s period; target < 1%)"), said
    assert "21.0 s without models in 5m00s" in rotation_text({"m5": early}, 0.0)  # the console gives the same answer
    later = early.model_copy(update={"wall_s": 3600, "overhead_pct": 0.583})
    assert rotation_schedule(later, 0.0).endswith("overhead 0.583% of 1h00m (target < 1%)")


def test_the_llama_server_build_says_its_step_count_and_keeps_every_line_in_its_log(tmp_path, capsys):
    """`make llama-server` printed three lines, then nothing for 8 minutes (the output went to build.log, unsaid)."""
    import sys

    from agents.orchestra.engines.llamacpp.build import _run

    ninja = "import sys\nfor i in range(1, 41): print(f'[{i}/40] Building CXX object ggml/src/f{i}.o')\nprint('linking')"
    log = tmp_path / "build.log"
    _run([sys.executable, "-c", ninja], log=log, progress="building llama-server")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("building")]
    steps = [line.split(" (")[0] for line in said]
    # not a terminal: a line every 5% of the steps, and the last one
    assert steps[0] == "building llama-server: step 1/40" and steps[-1] == "building llama-server: step 40/40"
    assert len(steps) == 21, said
    assert log.read_text().splitlines()[-1] == "linking" and len(log.read_text().splitlines()) == 41


def test_a_tiny_gguf_for_the_llamacpp_engine_is_one_command(tmp_path, capsys, monkeypatch):
    from gguf import GGUFReader

    from agents.orchestra.engines.llamacpp import build as llamacpp_build
    from agents.orchestra.engines.llamacpp import tiny_gguf

    monkeypatch.setattr(llamacpp_build, "vocab_file", lambda: None)  # no build yet: it says what to run
    assert tiny_gguf.main([str(tmp_path / "t.gguf")]) == 1
    assert "make llama-server" in capsys.readouterr().err
    monkeypatch.undo()
    if llamacpp_build.vocab_file() is None:
        import pytest

        pytest.skip("no llama-server build here: its tokenizer file is what the tiny model needs")
    assert tiny_gguf.main([str(tmp_path / "t.gguf"), "--lora", str(tmp_path / "l.gguf")]) == 0
    out = capsys.readouterr().out
    assert f"-m {tmp_path / 't.gguf'}" in out and "engine: llamacpp" in out
    assert GGUFReader(str(tmp_path / "t.gguf")).fields["general.architecture"] is not None and (tmp_path / "l.gguf").exists()


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_checkpoints_on_a_small_screen_show_rows_and_the_selected_step(frozen_app, size):  # noqa: F811
    """At 80x24 :checkpoints showed one table row, not the selected step, and a stray scrollbar mark on an empty row."""
    from agents.wire.catalogue.checkpoints import RunCheckpoints
    from console.tui.screens.checkpoints import CheckpointsScreen
    from tests.conftest import until_drawn
    from tests.screen_text import screen_lines
    from tests.test_checkpoints_console import frozen_run

    app = frozen_app
    async with app.run_test(size=size) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"checkpoints", "enter")
        await until_drawn(pilot, CheckpointsScreen)
        app.screen.show_detail(RunCheckpoints.model_validate(frozen_run()[1]))
        await pilot.pause()
        lines = screen_lines(app)
        top = next(i for i, line in enumerate(lines) if line.startswith(" STEP"))
        rows = lines[top + 1 : next(i for i in range(top, len(lines)) if lines[i].startswith("───"))]
        steps = [row.split()[0] for row in rows if row.strip() and row.split()[0].isdigit()]
        assert len(steps) >= 5 and "250" in steps, lines  # the best is selected: it is on screen
        assert not any(set(row.strip()) <= {"▏", "▕", "▎", "▍"} and row.strip() for row in rows), rows
        assert "BEST" in next(row for row in rows if row.split() and row.split()[0] == "250")


async def test_the_alerts_route_block_shows_its_last_line_at_120x40(frozen_app):  # noqa: F811
    """Four routes of the demo's kind wrap at 120 columns: a block of at most 8 lines hid the last one."""
    from agents.wire.sections.notify import RouteStatus
    from console.tui.screens.alerts import AlertsScreen
    from tests.conftest import until_drawn
    from tests.screen_text import screen_lines

    app = frozen_app
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        await pilot.press("colon", *"alerts", "enter")
        await until_drawn(pilot, AlertsScreen)
        screen = app.screen
        screen.routes = [
            (
                machine,
                RouteStatus(
                    name=f"team-chat-{i}",
                    kind="webhook",
                    format="slack",
                    simulated=True,
                    target=f"file console/team-chat.url of a lab kept in a long folder name number {i}",
                    delivered=3,
                    failures=1,
                    problem="the url file is readable by others" if i == 3 else None,
                ),
            )
            for i, machine in enumerate(["m5", "irina", "workstation", "pharaoh"])
        ]
        screen.refresh_data()
        await pilot.pause()
        said = " ".join(line.strip() for line in screen_lines(app))
        assert all(f"team-chat-{i} SIM" in said for i in range(4)) and "readable by others" in said, said
        assert said.count("3 delivered") == 4, said  # every route's line whole, the last one too


async def test_the_job_forms_help_is_whole_at_120_columns(frozen_app):  # noqa: F811
    from agents.wire.catalogue.jobs import RecipeParam
    from tests.conftest import until_drawn, wait_for
    from tests.screen_text import screen_lines

    help_text = "a checkpoint-<step> folder to continue from; its optimizer state and step count come along, the data order too"
    recipe = RecipeInfo(
        name="demo-lora",
        machine="m5",
        gpus=[0],
        output_dir="o",
        params=[RecipeParam(name="resume_from_checkpoint", type="str", help=help_text, flag="--resume-from-checkpoint")],
    )
    app = frozen_app
    async with app.run_test(size=(120, 40)) as pilot:
        await until_drawn(pilot)
        app.push_screen(StartJobScreen(recipe))
        await wait_for(lambda: isinstance(app.screen, StartJobScreen) and app.screen.query("#start-error"))
        await pilot.pause()
        await pilot.pause()
        form = [line[line.index("█") + 1 : line.rindex("█")] for line in screen_lines(app) if line.count("█") >= 2]  # its border
        said = " ".join(" ".join(form).split())
        assert help_text in said, said
