"""Trainer jobs end to end: real agents over SSH, the real tiny trainer, real processes, logs and SQLite."""

from __future__ import annotations

import psutil
import pytest

from agents.jobs import recipes
from agents.jobs.component import _alive
from agents.jobs.logs import Follower, tail
from agents.wire.lab.model import Trainer, TrainerParam
from agents.wire.protocol import ErrorCode, RemoteError

# ---------------------------------------------------------------------------- units


def test_torchrun_command_line_for_two_gpus():
    recipe = Trainer(
        name="ddp",
        machine="m5",
        gpus=[2, 3],
        launcher="torchrun",
        output_dir="out/{job_id}",
        command=["cetlab-train", "--config", "x.yaml", "--output-dir", "{output_dir}"],
        params=[TrainerParam(name="max_steps", type="int", default=10)],
    )
    argv = recipes.build_argv(recipe, recipes.resolve_params(recipe, {"max_steps": 7}), "m5-4", "/runs/m5-4", "/usr/bin/torchrun")
    assert argv == [
        "/usr/bin/torchrun",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--no-python",
        "cetlab-train",
        "--config",
        "x.yaml",
        "--output-dir",
        "/runs/m5-4",
        "--max-steps",
        "7",
    ]
    assert recipes.visible_devices(recipe.gpus) == "2,3"
    script = recipe.model_copy(update={"command": ["train.py"], "nproc_per_node": 4})
    assert recipes.build_argv(script, {}, "m5-5", "/o")[5:] == ["4", "train.py"]  # Python scripts run by torchrun itself


def test_params_are_typed_and_only_reach_the_command_as_declared_flags():
    recipe = Trainer(
        name="r",
        machine="m",
        output_dir="o",
        command=["t"],
        params=[
            TrainerParam(name="lr", type="float", min=0, max=1),
            TrainerParam(name="precision", type="choice", choices=["bf16", "fp16"], default="bf16"),
            TrainerParam(name="compile", type="bool", default=False),
            TrainerParam(name="tag", type="str", flag="--run-tag"),
        ],
    )
    values = recipes.resolve_params(recipe, {"lr": "0.5", "compile": "yes", "tag": "a b; rm -rf /"})
    assert recipes.param_args(recipe, values) == ["--lr", "0.5", "--precision", "bf16", "--compile", "--run-tag", "a b; rm -rf /"]
    for given, text in (
        ({"precision": "fp8"}, "not one of"),
        ({"tag": "--config=/etc"}, "may not start with '-'"),
        ({"compile": "maybe"}, "true or false"),
        ({"lr": "nan"}, "finite"),
        ({"lr": True}, "expected a number"),
    ):
        with pytest.raises(RemoteError) as info:
            recipes.resolve_params(recipe, given)
        assert info.value.code == ErrorCode.INVALID_PARAMS and text in info.value.message


def test_follower_keeps_reading_across_a_rotation(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("a\nb\n")
    follower = Follower(log, 0)
    assert follower.read()[0] == ["a", "b"]
    with log.open("a") as f:
        f.write("c\npartial")
    assert follower.read()[0] == ["c"]  # an unfinished line waits
    log.rename(tmp_path / "job.log.1")
    log.write_text("d\n")
    assert follower.read()[0] == ["partial", "d"]
    assert tail(log, 3)[0] == ["c", "partial", "d"]


def test_a_tail_past_what_one_read_takes_says_it_is_cut_and_skips_nothing(tmp_path):
    """Issue 30: `--tail 10000` of a 10 MB log gave 8,363 lines without a word; the tail says it is cut, and never
    joins the rotated file to the lines it read over the ones it skipped."""
    log = tmp_path / "job.log"
    (tmp_path / "job.log.1").write_text("rotated\n")
    log.write_text("".join(f"{i:06d} {'x' * 1016}\n" for i in range(10_000)))
    lines, size, cut = tail(log, 10_000)
    assert cut and size == log.stat().st_size and 8000 < len(lines) < 10_000
    assert [int(line[:6]) for line in lines] == list(range(10_000 - len(lines), 10_000))  # contiguous, to the end
    assert tail(log, 100) == (lines[-100:], size, False)
    assert tail(tmp_path / "none.log", 5) == ([], 0, False)


def test_a_reused_pid_is_not_mistaken_for_the_job():
    me = psutil.Process()
    assert _alive(me.pid, me.create_time())
    assert not _alive(me.pid, me.create_time() - 100)
    assert not _alive(None, None)


def test_recipe_params_are_checked_when_the_lab_loads():
    from agents.wire.lab.model import LabError, parse_lab

    text = """lab: x
machines: [{name: a, gpus: none}]
trainers:
  - name: t
    machine: a
    command: [x]
    output_dir: o
    params:
      - {name: steps, type: int}
      - {name: steps, type: int}
      - {name: mode, type: choice}
"""
    with pytest.raises(LabError) as info:
        parse_lab(text)
    assert info.value.problems == [
        "lab.yaml:10: trainers[0].params[1].name: param 'steps' declared twice",
        "lab.yaml:11: trainers[0].params[2].choices: a choice param needs choices: [...]",
    ]
