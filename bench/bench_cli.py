"""A cold `cetlab --json status` on the demo lab: wall time of the whole process, three ways in one run.

    python bench/bench_cli.py [RUNS]

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

Every process runs with its bytecode cached, as an installed cetlab does (pip writes the .pyc files):
PYTHONDONTWRITEBYTECODE is dropped for them, so the warm-up run writes the checkout's __pycache__.
Otherwise each run compiles cetlab's modules again (some 60 ms) while the floor's site-packages have
theirs, and the ratio measures the compiler.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import console_script, this_checkout_first  # noqa: E402
from console.demo import DemoLab  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FLOOR = "import asyncio, argparse, json, yaml\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    a: int = 0\n"


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, cwd=REPO)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{argv[0]} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return wall


def main() -> None:
    this_checkout_first()
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    with tempfile.TemporaryDirectory() as tmp, DemoLab(Path(tmp)) as demo:
        lab, agents = str(demo.lab_path), len(demo.processes)
        verb = ["--lab", lab, "--json", "status"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        ways = {
            "cetlab": ([console_script("cetlab"), *verb], env),
            "asyncssh": ([console_script("cetlab"), *verb], {**env, "CETLAB_SSH": "asyncssh"}),
            "baseline": ([sys.executable, "-c", f"import sys; from console.cli import main; sys.exit(main({verb!r}))"],
                         {**env, "CETLAB_SSH": "asyncssh"}),
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
        print(f"  {name:9s} median {median:.3f} s  (min {min(values):.3f}, max {max(values):.3f})  ratio to baseline {median / base:.3f}")
    verdict = "met" if statistics.median(walls["cetlab"]) <= 0.5 else "MISSED"
    print(f"goal <= 0.5 s: {verdict}; what every way must import costs {statistics.median(walls['floor']):.3f} s here")
    paired = statistics.median(c / f for c, f in zip(walls["cetlab"], walls["floor"]))
    of_medians = statistics.median(walls["cetlab"]) / statistics.median(walls["floor"])
    print(f"cetlab / floor: {paired:.2f}x (median of the rounds' ratios; ratio of the medians {of_medians:.2f}x) "
          f"(goal <= 2.0x: {'OK' if paired <= 2.0 else 'MISSED'})")


if __name__ == "__main__":
    main()
