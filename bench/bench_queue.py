"""The lab queue's decisions (agents/scheduler/placement.py), SIM: no agent, no process, the placement rule itself.

    python bench/bench_queue.py [--seed N] [--jobs N] [--machines N]

1. A compressed day on the demo lab's shape (3 machines, 9 simulated GPUs: a V100 and four P40s, two P4s, two
   more P40s), 6 of them held by warm models, 2 of those allowed to yield; 20 jobs of mixed priority, size and length,
   by need, submitted over the morning. The lab queue's policy (priority with an age bonus, the first in line keeping
   what it waits for while smaller jobs start around it) against a first-come-first-served queue of the same jobs in
   the same run, placed by the same rule (the smallest GPUs that do, models that may yield put aside) but in arrival
   order with the head of the line blocking the rest, as a script that waits for a free GPU does. Printed: the GPU-hours used over the GPU-hours
   free across the day for each, the ratio, and the mean and worst wait of the high-priority jobs.
2. The decision time of one pass at 1,000 queued jobs on 256 simulated machines of 8 GPUs, against the time to
   build the pass's picture of the lab alone (the baseline, in the same run): min / median / max of N passes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field

from agents.runtime.view import MachineView
from agents.scheduler.placement import Placement, lab_gpus, place, reserve, take
from agents.wire.lab.model import Lab, Trainer, parse_lab
from agents.wire.protocol import GpuSample, LinkStatus
from agents.wire.sections.jobs import JobInfo
from agents.wire.sections.models import ModelInfo, ModelsSection
from agents.wire.states import JobState, ModelState

GIB = 1024**3
DAY_S = 24 * 3600.0
STEP_S = 60.0  # the simulated queue looks once a minute

DEMO = """
lab: bench
machines:
  - name: m5
    gpus: {sim: [{name: Tesla V100, memory_gib: 32, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250},
                 {name: Tesla P40, memory_gib: 24, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250},
                 {name: Tesla P40, memory_gib: 24, tdp_w: 250}]}
  - name: m2
    gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}, {name: Tesla P4, memory_gib: 8, tdp_w: 75}]}
  - name: irina
    gpus: {sim: [{name: Tesla P40, memory_gib: 24, tdp_w: 250}, {name: Tesla P40, memory_gib: 24, tdp_w: 250}]}
models:
  - {name: llama-70b, path: x, engine: sim, machine: m5, gpus: [1, 2, 3, 4]}
  - {name: qwen-7b, path: x, engine: sim, machine: irina, gpus: [0]}
  - {name: embed, path: x, engine: sim, machine: m2, gpus: [1]}
orchestra: {pinned: [llama-70b], yields: [qwen-7b, embed]}
"""
SHAPES = {"m5": [("Tesla V100", 32)] + [("Tesla P40", 24)] * 4, "m2": [("Tesla P4", 8)] * 2, "irina": [("Tesla P40", 24)] * 2}


@dataclass
class Job:
    name: str
    recipe: Trainer
    priority: int
    submit_s: float
    length_s: float
    gpus: int
    started_s: float | None = None
    machine: str = ""
    on: list[int] = field(default_factory=list)
    yielded: tuple[str, ...] = ()


def day_jobs(seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for i in range(20):
        gpus = rng.choice([1, 1, 1, 2])
        vram = rng.choice([8, 16, 24])
        need = {"gpus": gpus, "min_vram_gib": vram}
        recipe = {"name": f"j{i}", "machine": "m5", "need": need, "command": ["x"], "output_dir": "r"}
        lab = parse_lab(DEMO + "trainers:\n" + "".join(f"  - {_flow(r)}\n" for r in (recipe,)))
        jobs.append(
            Job(
                f"j{i}",
                lab.trainers[0],
                priority=rng.choice([0, 0, 0, 5]),
                submit_s=rng.uniform(0, 6 * 3600),
                length_s=rng.uniform(0.5, 5) * 3600,
                gpus=gpus,
            )
        )
    return sorted(jobs, key=lambda j: j.submit_s)


def _flow(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, default_flow_style=True, width=10_000).strip()


def views(lab: Lab, running: list[Job], warm: dict[str, tuple[str, list[int]]]) -> list[tuple[str, MachineView]]:
    out = []
    for machine in lab.machines:
        view = MachineView(machine)
        view.set_link(LinkStatus.ONLINE)
        view.gpus = {
            i: GpuSample(index=i, name=n, mem_total_bytes=g * GIB, simulated=True)
            for i, (n, g) in enumerate(SHAPES[machine.name])
        }
        view.jobs = [
            JobInfo(
                id=j.name,
                recipe=j.name,
                machine=j.machine,
                gpus=j.on,
                state=JobState.RUNNING,
                started_at=0,
                output_dir="r",
                log_path="l",
            )
            for j in running
            if j.machine == machine.name
        ]
        view.models = ModelsSection(
            models=[
                ModelInfo(
                    name=name, machine=where, engine="sim", state=ModelState.WARM, since=0, gpus=gpus, pinned=name == "llama-70b"
                )
                for name, (where, gpus) in warm.items()
                if where == machine.name
            ]
        )
        out.append((machine.name, view))
    return out


WARM = {"llama-70b": ("m5", [1, 2, 3, 4]), "qwen-7b": ("irina", [0]), "embed": ("m2", [1])}


def simulate(jobs: list[Job], policy: str) -> dict[str, float]:
    """One day, a pass a minute: 'queue' (the lab queue's rule) or 'fcfs' (each job's own GPUs, head of line blocks)."""
    lab = parse_lab(DEMO)
    jobs = [Job(j.name, j.recipe, j.priority, j.submit_s, j.length_s, j.gpus) for j in jobs]
    warm = dict(WARM)
    running: list[Job] = []
    used_s = 0.0
    t = 0.0
    while t < 7 * DAY_S and (any(j.started_s is None for j in jobs) or running):  # until every job ran
        for job in [j for j in running if t >= (j.started_s or 0) + j.length_s]:
            running.remove(job)
            for model in job.yielded:
                warm[model] = WARM[model]  # back as it was
        waiting = [j for j in jobs if j.started_s is None and j.submit_s <= t]
        if policy == "queue":
            waiting.sort(key=lambda j: (-(j.priority + (t - j.submit_s) / 600.0), j.submit_s))
        picture = lab_gpus(lab, views(lab, running, warm), {}, t)
        blocked = False
        for job in waiting:
            recipe = job.recipe
            decision = place(recipe, picture, t)
            if isinstance(decision, Placement):
                take(picture, decision, job.name)
                job.started_s, job.machine, job.on, job.yielded = t, decision.machine, decision.gpus, decision.yields
                for model in decision.yields:
                    warm.pop(model, None)
                running.append(job)
            elif policy == "fcfs":
                break  # the head of the line blocks the rest
            elif not blocked:
                blocked = True
                reserve(recipe, picture, job.name)
        used_s += STEP_S * sum(len(j.on) for j in running)
        t += STEP_S
    end = max(((j.started_s or 0) + j.length_s for j in jobs if j.started_s is not None), default=t)
    free_gpu_s = (
        end * 9 - sum(len(g) for _, g in WARM.values()) * end + sum(len(WARM[m][1]) * j.length_s for j in jobs for m in j.yielded)
    )
    high = [(j.started_s or DAY_S) - j.submit_s for j in jobs if j.priority > 0]
    return {
        "utilisation": used_s / max(free_gpu_s, 1.0),
        "makespan_h": end / 3600,
        "high_wait_mean_min": statistics.mean(high) / 60 if high else 0.0,
        "high_wait_max_min": max(high) / 60 if high else 0.0,
        "unstarted": sum(1 for j in jobs if j.started_s is None),
    }


def decision_time(n_jobs: int, n_machines: int, rounds: int) -> tuple[list[float], list[float]]:
    rng = random.Random(1)
    machines = "".join(
        f"  - {{name: n{i}, gpus: {{sim: [{', '.join(['{name: Tesla P40, memory_gib: 24, tdp_w: 250}'] * 8)}]}}}}\n"
        for i in range(n_machines)
    )
    recipes = "".join(
        f"  - {{name: r{i}, machine: n{rng.randrange(n_machines)}, need: {{gpus: {rng.choice([1, 2, 4])}, min_vram_gib: 16}}, "
        "command: [x], output_dir: r}\n"
        for i in range(n_jobs)
    )
    lab = parse_lab(f"lab: scale\nmachines:\n{machines}trainers:\n{recipes}")
    seen = []
    for machine in lab.machines:
        view = MachineView(machine)
        view.set_link(LinkStatus.ONLINE)
        view.gpus = {i: GpuSample(index=i, name="Tesla P40", mem_total_bytes=24 * GIB, simulated=True) for i in range(8)}
        busy = rng.sample(range(8), 7)  # a full lab: one GPU in eight free
        view.jobs = [
            JobInfo(
                id=f"{machine.name}-1",
                recipe="x",
                machine=machine.name,
                gpus=busy,
                state=JobState.RUNNING,
                started_at=0,
                output_dir="r",
                log_path="l",
            )
        ]
        seen.append((machine.name, view))
    passes, pictures = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        lab_gpus(lab, seen, {}, 0.0)
        pictures.append(time.perf_counter() - started)
        started = time.perf_counter()
        picture = lab_gpus(lab, seen, {}, 0.0)
        blocked = False
        for recipe in lab.trainers:
            decision = place(recipe, picture, 0.0)
            if isinstance(decision, Placement):
                take(picture, decision, recipe.name)
            elif not blocked:
                blocked = True
                reserve(recipe, picture, recipe.name)
        passes.append(time.perf_counter() - started)
    return passes, pictures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--machines", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    jobs = day_jobs(args.seed)
    queue, fcfs = simulate(jobs, "queue"), simulate(jobs, "fcfs")
    print("SIM: one compressed day, 20 jobs on the demo lab's 9 GPUs (6 held by warm models, 2 of them may yield)")
    for name, figures in (("lab queue", queue), ("first come first served", fcfs)):
        print(
            f"  {name:<24} utilisation {figures['utilisation']:.0%} of the free GPU-hours · makespan {figures['makespan_h']:.1f} h"
            f" · high-priority wait mean {figures['high_wait_mean_min']:.0f} min, worst {figures['high_wait_max_min']:.0f} min"
            f" · never started {figures['unstarted']:.0f}"
        )
    print(f"  ratio: {queue['utilisation'] / max(fcfs['utilisation'], 1e-9):.2f}x the utilisation of first come first served")
    passes, pictures = decision_time(args.jobs, args.machines, args.rounds)
    print(f"SIM: one pass at {args.jobs} queued jobs on {args.machines} machines of 8 GPUs ({args.rounds} passes)")
    print(
        f"  pass min {min(passes) * 1000:.0f} ms, median {statistics.median(passes) * 1000:.0f} ms, max {max(passes) * 1000:.0f} ms;"
        f" the picture alone (baseline) median {statistics.median(pictures) * 1000:.1f} ms:"
        f" {statistics.median(passes) / max(statistics.median(pictures), 1e-9):.0f}x"
    )


if __name__ == "__main__":
    main()
