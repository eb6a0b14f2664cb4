"""The README's checkpoint walkthrough, run as written against the demo lab: real training, merge and serving."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agents.lab import load_lab
from console.demo import bundled_lab

REPO = Path(__file__).resolve().parent.parent
MARKER = "<!-- tested: tests/test_readme_walkthrough.py"
README_RUN = "m5-1"  # the run id the README uses: the first job of a fresh demo lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def walkthrough() -> list[str]:
    """The commands of the README block marked as tested, comments dropped."""
    text = (REPO / "README.md").read_text()
    after = text.split(MARKER, 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block and after.index("```sh") < after.index("\n\n"), "the marked block must follow its marker"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_states_the_demo_recipes_defaults():
    recipe = next(r for r in load_lab(bundled_lab()).trainers if r.name == "demo-lora")
    defaults = {p.name: p.default for p in recipe.params}
    text = (REPO / "README.md").read_text()
    assert f"`cetlab train demo-lora` runs {defaults['max_steps']} steps with a checkpoint every {defaults['save_steps']}" in text
    first = shlex.split(walkthrough()[0])
    assert first[:3] == ["cetlab", "train", "demo-lora"] and "--follow" in first


def test_the_checkpoint_walkthrough_runs_as_written(demo_lab):
    commands = walkthrough()
    assert [shlex.split(c)[1] for c in commands] == ["train", "checkpoints", "serve-checkpoint", "resume", "prune"]
    base = [sys.executable, "-m", "console.cli", "--lab", str(demo_lab.lab_path)]
    run_id = None
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "cetlab"
        if run_id:  # the demo lab of the test session may have run jobs before: its id, where the README says m5-1
            argv = [run_id if a == README_RUN else a for a in argv]
        result = subprocess.run(base + argv[1:], capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, f"`{command}` failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        outputs.append(result.stdout)
        if run_id is None:
            run_id = re.match(r"job (m5-\d+) \(demo-lora\)", result.stdout).group(1)
    served_model, resumed_job = re.search(r"on model (\S+), warm at http", outputs[2]), re.search(r"^job (m5-\d+) ", outputs[3], re.M)
    try:
        listing = outputs[1].splitlines()
        assert listing[0].startswith(f"run {run_id} on m5") and [int(row.split()[0]) for row in listing[2:]] == [160, 180, 200], outputs[1]
        assert served_model, outputs[2]  # "m5-1 step 200: merged on model m5-1-step200, warm at http://..."
        assert outputs[3].startswith(f"resumed {run_id} from step 180") and resumed_job, outputs[3]
        assert outputs[4].startswith(f"pruned run {run_id}: deleted "), outputs[4]
    finally:  # the session's demo lab goes on for other tests: stop what the walkthrough left running
        if resumed_job:
            subprocess.run(base + ["stop", resumed_job.group(1), "--kill"], capture_output=True, timeout=60)
        if served_model:
            subprocess.run(base + ["cold", served_model.group(1)], capture_output=True, timeout=120)
