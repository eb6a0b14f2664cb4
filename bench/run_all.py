"""`make bench`: every bench/bench_*.py in turn, its output as it comes, then one table of goals met and missed.

    python bench/run_all.py [--before REF] [BENCH.py ...]

A goal line is one a bench prints with the word "goal" and its verdict (OK / met / MISSED); the table ends
with every goal line (the figure, its baseline of the same run, the ratio, the verdict).
Exit status: 0 when every bench ran and met every goal it states, 1 when a goal was missed,
2 when a bench failed (exit status not 0). A bench that states no goal (figures only) is listed as such.

--before REF: first the same benches (this checkout's bench/ scripts) on a checkout of REF (a detached git
worktree, removed after), then here; the table then shows each goal line before and after. E.g.
`python bench/run_all.py --before main bench/bench_cli.py bench/bench_agent_overhead.py bench/bench_console_feed.py`,
issue 22's three speed figures.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
MET = re.compile(r"\b(OK|met)\b")
MISSED = re.compile(r"\bMISSED\b")


@dataclass
class Outcome:
    """One bench's run: how it ended, how long it took, its goal lines by verdict."""

    name: str
    exit_code: int = 0
    seconds: float = 0.0
    met: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    goals: list[str] = field(default_factory=list)  # met and missed, in the order printed


def verdicts(name: str, lines: list[str]) -> Outcome:
    """The goal lines of a bench's output, sorted into met and missed."""
    outcome = Outcome(name)
    for line in lines:
        if "goal" not in line:
            continue
        if MISSED.search(line):
            outcome.missed.append(line.strip())
        elif MET.search(line):
            outcome.met.append(line.strip())
        else:
            continue
        outcome.goals.append(line.strip())
    return outcome


def run(path: Path, cwd: Path | None = None) -> Outcome:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    outcome = verdicts(path.name, lines)
    outcome.exit_code = proc.wait()
    outcome.seconds = time.monotonic() - started
    return outcome


def summary(outcomes: list[Outcome]) -> tuple[str, int]:
    """The table `make bench` ends with, and its exit status."""
    rows = [f"{'bench':<28} {'time':>7}  {'met':>3}  {'missed':>6}  result"]
    for o in outcomes:
        result = (
            f"FAILED (exit {o.exit_code})"
            if o.exit_code != 0
            else "MISSED"
            if o.missed
            else "figures only"
            if not o.met
            else "met"
        )
        rows.append(f"{o.name:<28} {o.seconds:6.0f}s  {len(o.met):>3}  {len(o.missed):>6}  {result}")
    rows += [f"  {'MISSED' if line in o.missed else 'met   '}: {o.name}: {line}" for o in outcomes for line in goal_lines(o)]
    total = sum(o.seconds for o in outcomes)
    rows.append(
        f"all benches: {total / 60:.1f} min; {sum(len(o.met) for o in outcomes)} goals met, "
        f"{sum(len(o.missed) for o in outcomes)} missed"
    )
    status = 2 if any(o.exit_code != 0 for o in outcomes) else 1 if any(o.missed for o in outcomes) else 0
    return "\n".join(rows), status


def goal_lines(outcome: Outcome) -> list[str]:
    return outcome.goals or outcome.met + outcome.missed


def before_after(before: list[Outcome], after: list[Outcome], ref: str) -> str:
    """Each bench's goal lines on REF's checkout and on this one, one under the other."""
    rows = [f"before ({ref}) and after (this checkout), the same bench scripts; each a run of its own:"]
    for b, a in zip(before, after):
        rows.append(f"  {a.name}" + (f"  (before: FAILED, exit {b.exit_code})" if b.exit_code else ""))
        for line_b, line_a in zip(goal_lines(b), goal_lines(a)):
            rows += [f"    before: {line_b}", f"    after : {line_a}"]
    return "\n".join(rows)


def run_before(ref: str, paths: list[Path]) -> list[Outcome]:
    """The benches on a detached worktree of REF, with this checkout's bench/ copied in (the same measurement)."""
    repo = HERE.parent
    base = Path(tempfile.mkdtemp(prefix="cetlab-bench-before-")) / "tree"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(base), ref], check=True, capture_output=True)
    try:
        shutil.rmtree(base / "bench")
        shutil.copytree(HERE, base / "bench", ignore=shutil.ignore_patterns("__pycache__"))
        outcomes = []
        for path in paths:
            print(f"\n=== {path.name} (before: {ref})", flush=True)
            outcomes.append(run(base / "bench" / path.name, cwd=base))
        return outcomes
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(base)], capture_output=True)
        shutil.rmtree(base.parent, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Run the benches; one table of goals met and missed.")
    parser.add_argument("--before", metavar="REF", help="run them on a checkout of REF first: before and after")
    parser.add_argument("benches", nargs="*", type=Path, help="bench scripts (default: every bench/bench_*.py)")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.benches] or sorted(HERE.glob("bench_*.py"))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    before = run_before(args.before, paths) if args.before else None
    outcomes = []
    for path in paths:
        print(f"\n=== {path.name}", flush=True)
        outcomes.append(run(path, cwd=HERE.parent))
    table, status = summary(outcomes)
    print("\n" + table)
    print(
        f"load average at the start {load}, at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        f"({os.cpu_count()} cores): the CPU and wall figures move with it"
    )
    if before is not None:
        print("\n" + before_after(before, outcomes, args.before))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
