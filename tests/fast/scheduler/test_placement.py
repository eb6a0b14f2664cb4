"""The lab queue's one placement rule, on typed views as the agents push them: where a job starts now, or why it
waits in words, and when it may start; a pass never gives a GPU twice."""

from __future__ import annotations

import time

import pytest

from agents.runtime.view import MachineView
from agents.scheduler.placement import Placement, Wait, lab_gpus, need_words, place, reserve, take
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import GpuSample, LinkStatus
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo, ModelsSection
from agents.wire.states import JobState, ModelState

GIB = 1024**3
NOW = 1_800_000_000.0

LAB = """
lab: q
machines:
  - name: m5
    gpus: {sim: [{name: Tesla V100, memory_gib: 32, tdp_w: 250},
                 {name: Tesla P40, memory_gib: 24, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250},
                 {name: Tesla P40, memory_gib: 24, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250}]}
  - name: m2
    gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}, {name: Tesla P4, memory_gib: 8, tdp_w: 75}]}
models:
  - {name: big70, path: x, engine: sim, machine: m5, gpus: [1, 2, 3, 4]}
  - {name: small8, path: x, engine: sim, machine: m5, gpus: [0]}
orchestra: {pinned: [big70], yields: [small8]}
trainers:
  - {name: fixed, machine: m5, gpus: [0], command: [x], output_dir: runs}
  - {name: big, need: {gpus: 1, min_vram_gib: 24}, machine: m5, command: [x], output_dir: runs}
  - {name: small, need: {gpus: 1, min_vram_gib: 8}, machine: m2, command: [x], output_dir: runs}
  - {name: pair, need: {gpus: 2, min_vram_gib: 8, machines: [m2]}, command: [x], output_dir: runs}
  - {name: volta, need: {gpus: 1, min_compute_capability: "7.0"}, machine: m5, command: [x], output_dir: runs}
  - {name: p40s, need: {gpus: 2, gpu_name: "*p40*"}, machine: m5, command: [x], output_dir: runs}
"""


def gpu(index: int, name: str, gib: int) -> GpuSample:
    return GpuSample(index=index, name=name, mem_total_bytes=gib * GIB, simulated=True)


def views(jobs: dict[str, list[JobInfo]] | None = None, models: dict[str, list[ModelInfo]] | None = None, offline=()):
    lab = parse_lab(LAB)
    shapes = {"m5": [("Tesla V100", 32)] + [("Tesla P40", 24)] * 4, "m2": [("Tesla P4", 8)] * 2}
    out = []
    for machine in lab.machines:
        view = MachineView(machine)
        view.set_link(LinkStatus.OFFLINE if machine.name in offline else LinkStatus.ONLINE)
        view.gpus = {i: gpu(i, n, g) for i, (n, g) in enumerate(shapes[machine.name])}
        view.jobs = (jobs or {}).get(machine.name, [])
        view.models = ModelsSection(models=(models or {}).get(machine.name, []))
        out.append((machine.name, view))
    return lab, out


def job(job_id: str, gpus: list[int], eta_s: float | None = None) -> JobInfo:
    return JobInfo(
        id=job_id, recipe="sft", machine=job_id.split("-")[0], gpus=gpus, state=JobState.RUNNING,
        started_at=NOW - 60, output_dir="runs", log_path="log", eta_s=eta_s,
    )  # fmt: skip


def model(name: str, gpus: list[int], pinned: bool = False, state: ModelState = ModelState.WARM) -> ModelInfo:
    return ModelInfo(name=name, machine="m5", engine="sim", state=state, since=NOW, gpus=gpus, pinned=pinned)


def recipe(lab, name):
    return next(r for r in lab.trainers if r.name == name)


def test_a_recipe_with_numbers_starts_on_them_when_free_and_says_what_holds_them_when_not():
    lab, seen = views()
    assert place(recipe(lab, "fixed"), lab_gpus(lab, seen, {}, NOW), NOW) == Placement("m5", [0])
    lab, seen = views(jobs={"m5": [job("m5-12", [0], eta_s=3600)]})
    wait = place(recipe(lab, "fixed"), lab_gpus(lab, seen, {}, NOW), NOW)
    assert isinstance(wait, Wait) and wait.expected_start == NOW + 3600
    clock = time.strftime("%H:%M", time.localtime(NOW + 3600))
    assert wait.reason == f"waiting for GPU 0 of m5: m5 GPU 0 runs job m5-12 (sft) until about {clock}"


def test_a_recipe_by_need_takes_the_smallest_gpus_that_do_and_leaves_the_big_ones():
    lab, seen = views()
    picture = lab_gpus(lab, seen, {}, NOW)
    assert place(recipe(lab, "small"), picture, NOW) == Placement("m2", [0])  # a P4 does: the P40s and the V100 stay
    assert place(recipe(lab, "big"), picture, NOW) == Placement("m5", [1])  # a P40, not the 32 GiB V100
    assert place(recipe(lab, "volta"), picture, NOW) == Placement("m5", [0])  # only the V100 is 7.0
    assert place(recipe(lab, "p40s"), picture, NOW) == Placement("m5", [1, 2])
    assert place(recipe(lab, "pair"), picture, NOW) == Placement("m2", [0, 1])


def test_the_reason_names_every_holder_and_every_machine_that_cannot_fit():
    held = {"m5": [model("llama-3.1-70b-4bit", [1, 2, 3, 4], pinned=True)]}
    lab, seen = views(jobs={"m5": [job("m5-12", [0])]}, models=held)
    wait = place(recipe(lab, "big"), lab_gpus(lab, seen, {}, NOW), NOW)
    assert isinstance(wait, Wait) and wait.expected_start is None  # a pinned model and a job with no ETA: not known
    assert wait.reason == (
        "waiting for 1 GPU >= 24 GiB: m5 GPU 0 runs job m5-12 (sft); "
        "m5 GPUs 1-4 hold model llama-3.1-70b-4bit (warm, pinned); "
        "m2 has 0 GPUs that fit (GPU 0 (Tesla P4) has 8 GiB, under 24 GiB)"
    )
    lab, seen = views(offline=("m2",))
    wait = place(recipe(lab, "pair"), lab_gpus(lab, seen, {}, NOW), NOW)
    assert isinstance(wait, Wait) and wait.reason == "waiting for 2 GPUs >= 8 GiB on m2: m2: its link is offline"


def test_a_sleeping_model_holds_no_gpu_and_a_loading_one_does():
    lab, seen = views(models={"m5": [model("a", [0], state=ModelState.SLEEPING), model("b", [1], state=ModelState.LOADING)]})
    picture = lab_gpus(lab, seen, {}, NOW)
    assert picture["m5"].free(0) and not picture["m5"].free(1)


def test_one_pass_never_gives_a_gpu_twice_and_starting_jobs_count_as_holders():
    lab, seen = views()
    picture = lab_gpus(lab, seen, {("m2", 0): "queue entry 3 (small, starting)"}, NOW)
    first = place(recipe(lab, "small"), picture, NOW)
    assert first == Placement("m2", [1])  # GPU 0 is being started on: no tick shows it yet
    take(picture, first, "queue entry 4")
    second = place(recipe(lab, "small"), picture, NOW)
    assert isinstance(second, Placement) and second.machine == "m5"  # the P4s are gone: a bigger GPU does
    given = {(first.machine, g) for g in first.gpus}
    assert not given & {(second.machine, g) for g in second.gpus}


def test_the_first_in_line_keeps_what_it_waits_for_from_those_behind_it():
    lab, seen = views(models={"m5": [model("x", [1, 2, 3])]})
    picture = lab_gpus(lab, seen, {}, NOW)
    assert isinstance(place(recipe(lab, "p40s"), picture, NOW), Wait)  # one P40 free, it needs two
    reserve(recipe(lab, "p40s"), picture, "queue entry 1 (p40s), next in line")
    behind = place(recipe(lab, "big"), picture, NOW)
    assert behind == Placement("m5", [0])  # the free P40 is kept for the first in line: the V100 does for this one
    assert not picture["m5"].free(4)


@pytest.mark.parametrize(
    ("name", "words"),
    [("fixed", "GPU 0 of m5"), ("big", "1 GPU >= 24 GiB"), ("pair", "2 GPUs >= 8 GiB on m2"), ("p40s", "2 GPUs named *p40*")],
)
def test_what_a_recipe_waits_for_in_words(name, words):
    lab, _ = views()
    assert need_words(recipe(lab, name)) == words


def test_a_model_that_may_yield_gives_its_gpus_and_a_pinned_one_never_does():
    held = {"m5": [model("big70", [1, 2, 3, 4], pinned=True), model("small8", [0])]}
    lab, seen = views(models=held)
    picture = lab_gpus(lab, seen, {}, NOW)
    assert place(recipe(lab, "fixed"), picture, NOW) == Placement("m5", [0], ("small8",))
    assert place(recipe(lab, "volta"), picture, NOW) == Placement("m5", [0], ("small8",))
    assert place(recipe(lab, "big"), picture, NOW) == Placement("m5", [0], ("small8",))  # the pinned P40s stay
    assert isinstance(place(recipe(lab, "p40s"), picture, NOW), Wait)  # only the pinned model holds the P40s
    assert place(recipe(lab, "small"), picture, NOW) == Placement("m2", [0])  # a free GPU beats putting a model aside
    busy = {"m5": [model("small8", [0], state=ModelState.LOADING)]}  # mid-operation: not asked to give way
    lab, seen = views(models=busy)
    assert isinstance(place(recipe(lab, "fixed"), lab_gpus(lab, seen, {}, NOW), NOW), Wait)


def test_a_pinned_model_cannot_be_listed_to_yield():
    from agents.wire.lab.model import LabError

    with pytest.raises(LabError, match="big70 is pinned: a pinned model never yields its GPUs"):
        parse_lab(LAB.replace("yields: [small8]", "yields: [small8, big70]"))
