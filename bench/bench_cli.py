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
Goal (issue 10): <= 0.5 s.
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

from bench.common import console_script  # noqa: E402
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
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    with tempfile.TemporaryDirectory() as tmp, DemoLab(Path(tmp)) as demo:
        lab, agents = str(demo.lab_path), len(demo.processes)
        verb = ["--lab", lab, "--json", "status"]
        env = dict(os.environ)
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
    print(f"cold `cetlab --json status`, demo lab ({agents} agent processes), {runs} interleaved runs each")
    for name, values in walls.items():
        median = statistics.median(values)
        print(f"  {name:9s} median {median:.3f} s  (min {min(values):.3f}, max {max(values):.3f})  ratio to baseline {median / base:.3f}")
    verdict = "met" if statistics.median(walls["cetlab"]) <= 0.5 else "MISSED"
    print(f"goal <= 0.5 s: {verdict}; what every way must import costs {statistics.median(walls['floor']):.3f} s here")


if __name__ == "__main__":
    main()
