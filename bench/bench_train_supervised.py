"""What supervision costs a training run: the tiny model's throughput under the agent vs the same cetlab-train run bare.

Both run the same command (the demo recipe: LoRA on the tiny Llama, --steps steps, one
checkpoint at the end) from the same folder with the same progress file protocol. The
supervised run is started with `jobs.start` over SSH through the runner (own session,
output through the rotating log), with the agent ticking at 1 Hz (progress file, GPU
claim, CPU sampling) and a console subscribed to the stream. Throughput is the trainer's
own figure: steps / train_runtime (model load and imports excluded), best of --rounds
each, alternated in one run. Goal: ratio >= 0.97.

    python bench/bench_train_supervised.py [--steps 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents.shell.demo.lab import DemoLab  # noqa: E402
from agents.wire.catalogue.jobs import JOBS_START, StartParams  # noqa: E402
from agents.wire.catalogue.method import request  # noqa: E402
from agents.wire.lab.model import load_lab  # noqa: E402
from bench.common import console_script  # noqa: E402
from console.lab.client import FleetClient  # noqa: E402


def train_runtime_s(log_text: str) -> float:
    """The trainer's summary line: `cetlab-train: trained N steps, train_runtime 1.234s ...`."""
    for line in reversed(log_text.splitlines()):
        found = re.search(r"train_runtime ([0-9.]+)s", line)
        if found:
            return float(found.group(1))
    raise RuntimeError("no training summary in the log:\n" + log_text[-2000:])


def command(tiny: Path, output_dir: str) -> list[str]:
    """The recipe's command, the same cetlab-train for both runs; the agent adds the params as `--max-steps N --save-steps N`."""
    return [
        console_script("cetlab-train"),
        "--config",
        "demo/train.yaml",
        "--output-dir",
        output_dir,
        "--set",
        f"base_model={tiny}",
    ]


def run_bare(lab_dir: Path, tiny: Path, steps: int, n: int) -> tuple[float, float]:
    out = lab_dir / "bare" / str(n)
    out.mkdir(parents=True)
    env = {**os.environ, "CETLAB_PROGRESS_FILE": str(out / "progress.json"), "CUDA_VISIBLE_DEVICES": "0"}
    t0 = time.perf_counter()
    with open(out / "train.log", "wb") as log:
        argv = command(tiny, str(out)) + ["--max-steps", str(steps), "--save-steps", str(steps)]
        code = subprocess.run(argv, cwd=lab_dir, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    assert code == 0, (out / "train.log").read_text()[-2000:]
    return train_runtime_s((out / "train.log").read_text()), wall


async def run_supervised(client: FleetClient, steps: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    job = await request(client, "box", JOBS_START, StartParams(recipe="tiny", params={"max_steps": steps, "save_steps": steps}))
    view = client.state.machines["box"]
    while True:  # watch it the way the console does: from the stream, no extra calls
        mine = next((j for j in view.jobs if j.id == job.id), None)
        if mine and mine.state not in ("starting", "running", "stopping"):
            break
        await asyncio.sleep(0.1)
    wall = time.perf_counter() - t0
    assert mine.state == "exited" and mine.exit_code == 0, mine
    return train_runtime_s(Path(job.log_path).read_text()), wall


async def measure(args: argparse.Namespace, work: Path) -> dict:
    from agents.train.tiny import make_tiny_model

    tiny = make_tiny_model(work / "tiny-llama")
    source = work / "src"
    source.mkdir()
    shutil.copytree(REPO / "demo", source / "demo")
    lab = {
        "lab": "bench-train",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla V100", "memory_gib": 32, "tdp_w": 250}]}}],
        "trainers": [
            {
                "name": "tiny",
                "machine": "box",
                "gpus": [0],
                "output_dir": "runs/{job_id}",
                "command": command(tiny, "{output_dir}"),
                "params": [{"name": "max_steps", "type": "int"}, {"name": "save_steps", "type": "int"}],
            }
        ],
    }
    (source / "lab.yaml").write_text(yaml.safe_dump(lab, sort_keys=False))
    best = {"bare": 0.0, "supervised": 0.0}
    walls: dict[str, list[float]] = {"bare": [], "supervised": []}
    rates: dict[str, list[float]] = {"bare": [], "supervised": []}
    with DemoLab(work / "run", source=source / "lab.yaml") as demo:
        client = FleetClient(load_lab(demo.lab_path))
        await client.start()
        await client.wait_connected(15)
        try:
            for n in range(args.rounds):
                for kind in ("bare", "supervised"):
                    if kind == "bare":
                        runtime, wall = await asyncio.to_thread(run_bare, demo.dir, tiny, args.steps, n)
                    else:
                        runtime, wall = await run_supervised(client, args.steps)
                    best[kind] = max(best[kind], args.steps / runtime)
                    rates[kind].append(round(args.steps / runtime, 2))
                    walls[kind].append(round(wall, 2))
        finally:
            await client.stop()
    return {
        "steps": args.steps,
        "rounds": args.rounds,
        "bare_steps_per_s": round(best["bare"], 2),
        "supervised_steps_per_s": round(best["supervised"], 2),
        "ratio": round(best["supervised"] / best["bare"], 3),
        "goal": ">= 0.97",
        "steps_per_s": rates,  # every run, in order
        "wall_s": walls,  # whole runs, imports and model load included
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-supervised-"))
    try:
        result = asyncio.run(measure(args, work))
        print(json.dumps(result))
        # the verdict on stderr: stdout stays one JSON line (`make bench` reads both)
        print(
            f"supervised / bare steps/s: ratio {result['ratio']:.3f} (goal >= 0.97: {'OK' if result['ratio'] >= 0.97 else 'MISSED'})",
            file=sys.stderr,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
