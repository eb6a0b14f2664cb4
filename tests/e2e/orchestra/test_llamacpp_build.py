"""The llama-server build says its step count and keeps every line of the build in its log."""

from __future__ import annotations


def test_the_llama_server_build_says_its_step_count_and_keeps_every_line_in_its_log(tmp_path, capsys):
    """`make llama-server` printed three lines, then nothing for 8 minutes (the output went to build.log, unsaid)."""
    import sys

    from agents.orchestra.engines.llamacpp.build import _run

    ninja = "import sys\nfor i in range(1, 41): print(f'[{i}/40] Building CXX object ggml/src/f{i}.o')\nprint('linking')"
    log = tmp_path / "build.log"
    _run([sys.executable, "-c", ninja], log=log, progress="building llama-server")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("building")]
    steps = [line.split(" (")[0] for line in said]
    # not a terminal: a line every 5% of the steps, and the last one
    assert steps[0] == "building llama-server: step 1/40" and steps[-1] == "building llama-server: step 40/40"
    assert len(steps) == 21, said
    assert log.read_text().splitlines()[-1] == "linking" and len(log.read_text().splitlines()) == 41
