"""The bench harness runs and prints its table: bench/run_all.py's goal lines, the agent-overhead bench without NVML.

No figure is asserted (the benches measure; tests do not time): only that the scripts run and say what they found.
"""

from __future__ import annotations

from pathlib import Path

from bench import run_all


def write_bench(directory: Path, name: str, lines: list[str], exit_code: int = 0) -> Path:
    path = directory / name
    path.write_text("import sys\n" + "".join(f"print({line!r})\n" for line in lines) + f"sys.exit({exit_code})\n")
    return path


def test_run_all_lists_every_goal_line_with_its_verdict(tmp_path, capsys):
    met = write_bench(tmp_path, "bench_met.py", ["figure 1.2x the floor (goal <= 2.0x: OK)", "other figure 3 s"])
    missed = write_bench(tmp_path, "bench_missed.py", ["RSS 1.9x the loop (goal <= 1.3x: MISSED)"])
    quiet = write_bench(tmp_path, "bench_quiet.py", ["a figure, no goal"])

    status = run_all.main([str(met), str(missed), str(quiet)])

    out = capsys.readouterr().out
    table = out[out.index("bench ") :]
    assert status == 1  # a goal was missed
    assert "met   : bench_met.py: figure 1.2x the floor (goal <= 2.0x: OK)" in table
    assert "MISSED: bench_missed.py: RSS 1.9x the loop (goal <= 1.3x: MISSED)" in table
    assert "bench_quiet.py" in table and "figures only" in table
    assert "load average at the start" in out


def test_run_all_says_a_bench_failed(tmp_path, capsys):
    broken = write_bench(tmp_path, "bench_broken.py", ["figure (goal: OK)"], exit_code=3)
    assert run_all.main([str(broken)]) == 2
    assert "FAILED (exit 3)" in capsys.readouterr().out


def test_before_after_pairs_each_goal_line():
    before = run_all.Outcome("bench_cli.py", met=["cetlab / floor: 2.10x (goal <= 2.0x: OK)"])
    after = run_all.Outcome("bench_cli.py", met=["cetlab / floor: 1.40x (goal <= 2.0x: OK)"])
    text = run_all.before_after([before], [after], "main")
    assert "before: cetlab / floor: 2.10x" in text and "after : cetlab / floor: 1.40x" in text
    assert text.index("before: cetlab") < text.index("after : cetlab")
