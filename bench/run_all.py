"""`make bench`: every bench/bench_*.py in turn, its output as it comes, then one table of goals met and missed.

A goal line is one a bench prints with the word "goal" and its verdict (OK / met / MISSED).
Exit status: 0 when every bench ran and met every goal it states, 1 when a goal was missed,
2 when a bench failed (exit status not 0). A bench that states no goal (figures only) is listed as such.
"""

from __future__ import annotations

import re
import subprocess
import sys
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
    return outcome


def run(path: Path) -> Outcome:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        result = (f"FAILED (exit {o.exit_code})" if o.exit_code != 0 else "MISSED" if o.missed
                  else "figures only" if not o.met else "met")
        rows.append(f"{o.name:<28} {o.seconds:6.0f}s  {len(o.met):>3}  {len(o.missed):>6}  {result}")
    rows += [f"  missed: {o.name}: {line}" for o in outcomes for line in o.missed]
    total = sum(o.seconds for o in outcomes)
    rows.append(f"all benches: {total / 60:.1f} min; {sum(len(o.met) for o in outcomes)} goals met, "
                f"{sum(len(o.missed) for o in outcomes)} missed")
    status = 2 if any(o.exit_code != 0 for o in outcomes) else 1 if any(o.missed for o in outcomes) else 0
    return "\n".join(rows), status


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(HERE.glob("bench_*.py"))
    outcomes = []
    for path in paths:
        print(f"\n=== {path.name}", flush=True)
        outcomes.append(run(path))
    table, status = summary(outcomes)
    print("\n" + table)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
