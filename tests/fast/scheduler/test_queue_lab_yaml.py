"""lab.yaml's queue keys: scheduler: names a machine, need: replaces GPU numbers, and the errors say where."""

from __future__ import annotations

import pytest

from agents.wire.lab.model import LabError, parse_lab
from agents.wire.lab.queue import scheduler_machine

BASE = """
lab: q
machines:
  - {name: a, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}
  - {name: b, gpus: none}
"""


def test_the_queue_is_kept_by_the_named_machine_else_the_gateways_else_the_first():
    assert scheduler_machine(parse_lab(BASE)) == "a"
    assert scheduler_machine(parse_lab(BASE + "gateway: {machine: b}\n")) == "b"
    assert scheduler_machine(parse_lab(BASE + "gateway: {machine: a}\nscheduler: {machine: b}\n")) == "b"


def test_a_recipe_by_need_takes_its_home_from_its_machines():
    lab = parse_lab(BASE + "trainers:\n  - {name: t, need: {gpus: 1, machines: [b, a]}, command: [x], output_dir: r}\n")
    assert lab.trainers[0].machine == "b" and lab.trainers[0].need is not None and lab.trainers[0].priority == 0


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        ("scheduler: {machine: zz}\n", "lab.yaml:6: scheduler.machine: no machine named 'zz' (machines: a, b)"),
        (
            "trainers:\n  - {name: t, machine: a, gpus: [0], need: {gpus: 1}, command: [x], output_dir: r}\n",
            "lab.yaml:7: trainers[0].need: a recipe asks either for GPU numbers (gpus: [...]) or by need (need: {gpus: N}), not both",
        ),
        (
            "trainers:\n  - {name: t, need: {gpus: 1, machines: [a, zz]}, command: [x], output_dir: r}\n",
            "lab.yaml:7: trainers[0].need.machines[1]: no machine named 'zz'",
        ),
        (
            "trainers:\n  - {name: t, machine: a, need: {gpus: 0}, command: [x], output_dir: r}\n",
            "lab.yaml:7: trainers[0].need.gpus: Input should be greater than or equal to 1",
        ),
        (
            "trainers:\n  - {name: t, machine: a, priority: 5000, command: [x], output_dir: r}\n",
            "lab.yaml:7: trainers[0].priority: Input should be less than or equal to 1000",
        ),
    ],
)
def test_bad_queue_keys_are_refused_naming_where(tail, said):
    with pytest.raises(LabError) as refused:
        parse_lab(BASE + tail)
    assert said in str(refused.value)
