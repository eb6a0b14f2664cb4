"""A cold `cetlab --json status` on the demo lab: wall time of the whole process, three ways in one run.

    python bench/bench_cli.py [RUNS] [--before CHECKOUT]

- **cetlab**: the command as installed (the OpenSSH client where `ssh` is on PATH, the
  collector paused for the imports, no interpreter teardown);
- **asyncssh**: the same with `CETLAB_SSH=asyncssh` (the library client: what the console uses);
- **baseline**: `console.cli.main` called plainly, as the command ran before (asyncssh, the
  collector on, the interpreter torn down at exit).

Runs are interleaved (A B C A B C ...) so a drift of the machine's speed touches all three;
medians and the ratio to the baseline are printed, and the floor: a process that only
imports what every way must (asyncio, argparse, yaml, pydantic with one model).
Goals: <= 0.5 s (issue 10); <= 2.0x the floor measured in the same run (issue 22), taken as the
median over the runs of cetlab's wall / the floor's wall of the same round (a round's drift cancels).

--before CHECKOUT (a checkout of an older commit, e.g. `git worktree add --detach DIR main`): a second demo lab
whose agents run that checkout's code, and its `cetlab` against it, interleaved in the same rounds: before and
after under the same load (the agents' side counts too: their SSH server is half of a login).

Every process runs with its bytecode cached, as an installed cetlab does (pip writes the .pyc files):
PYTHONDONTWRITEBYTECODE is dropped for them, so the warm-up run writes the checkout's __pycache__.
Otherwise each run compiles cetlab's modules again (some 60 ms) while the floor's site-packages have
theirs, and the ratio measures the compiler.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.shell.demo.lab import DemoLab
from bench.common import console_script, this_checkout_first

REPO = Path(__file__).resolve().parent.parent
FLOOR = "import asyncio, argparse, json, yaml\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    a: int = 0\n"


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, cwd=REPO)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return wall


def lab_of(checkout: Path, directory: Path, stack: ExitStack) -> DemoLab:
    """A demo lab whose agents run CHECKOUT's code (they inherit PYTHONPATH when started)."""
    saved = os.environ["PYTHONPATH"]
    os.environ["PYTHONPATH"] = str(checkout)
    try:
        return stack.enter_context(DemoLab(directory))
    finally:
        os.environ["PYTHONPATH"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description="A cold `cetlab --json status`, against the floor and the old ways.")
    parser.add_argument("runs", nargs="?", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument(
        "--before", type=Path, metavar="CHECKOUT", help="also an older checkout's agents and cetlab, in the same rounds"
    )
    args = parser.parse_args()
    this_checkout_first()
    runs = args.runs
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        demo = stack.enter_context(DemoLab(Path(tmp) / "after"))
        lab, agents = str(demo.lab_path), len(demo.processes)
        verb = ["--lab", lab, "--json", "status"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        ways: dict[str, tuple[list[str], dict[str, str]]] = {}
        if args.before:
            old = lab_of(args.before.resolve(), Path(tmp) / "before", stack)
            ways["before"] = (
                [console_script("cetlab"), "--lab", str(old.lab_path), "--json", "status"],
                {**env, "PYTHONPATH": str(args.before.resolve())},
            )
        ways |= {
            "cetlab": ([console_script("cetlab"), *verb], env),
            "asyncssh": ([console_script("cetlab"), *verb], {**env, "CETLAB_SSH": "asyncssh"}),
            "baseline": (
                [sys.executable, "-c", f"import sys; from console.cli.main import main; sys.exit(main({verb!r}))"],
                {**env, "CETLAB_SSH": "asyncssh"},
            ),
            "floor": ([sys.executable, "-c", FLOOR], env),
        }
        for argv, way_env in ways.values():  # warm the page cache and the agents
            timed(argv, way_env)
        walls: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(runs):
            for name, (argv, way_env) in ways.items():
                walls[name].append(timed(argv, way_env))
    base = statistics.median(walls["baseline"])
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"cold `cetlab --json status`, demo lab ({agents} agent processes), {runs} interleaved runs each; load average {load}")
    for name, values in walls.items():
        median = statistics.median(values)
        print(
            f"  {name:9s} median {median:.3f} s  (min {min(values):.3f}, max {max(values):.3f})  ratio to baseline {median / base:.3f}"
        )
    verdict = "met" if statistics.median(walls["cetlab"]) <= 0.5 else "MISSED"
    print(f"goal <= 0.5 s: {verdict}; what every way must import costs {statistics.median(walls['floor']):.3f} s here")
    paired = statistics.median(c / f for c, f in zip(walls["cetlab"], walls["floor"]))
    of_medians = statistics.median(walls["cetlab"]) / statistics.median(walls["floor"])
    print(
        f"cetlab / floor: {paired:.2f}x (median of the rounds' ratios; ratio of the medians {of_medians:.2f}x) "
        f"(goal <= 2.0x: {'OK' if paired <= 2.0 else 'MISSED'})"
    )
    if args.before:
        before = statistics.median(b / f for b, f in zip(walls["before"], walls["floor"]))
        print(
            f"before ({args.before}): {statistics.median(walls['before']):.3f} s, {before:.2f}x the floor; "
            f"after / before {statistics.median(a / b for a, b in zip(walls['cetlab'], walls['before'])):.2f} (median of the rounds' ratios)"
        )


if __name__ == "__main__":
    main()
