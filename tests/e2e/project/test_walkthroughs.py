"""The manual's walkthroughs, run as written against the demo lab: the checkpoint walkthrough (real training, merge and
serving, docs/checkpoints.md), the gateway's curl examples (docs/gateway.md) and the multi-node run (docs/training.md)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.wire.lab.model import load_lab
from console.lab.demo import bundled_lab
from tests.support.waits import wait_until

REPO = Path(__file__).resolve().parents[3]


DOCS = REPO / "docs"


MARKER = "<!-- tested: tests/e2e/project/test_walkthroughs.py"


PAGE_RUN = "m5-1"  # the run id the page uses: the first job of a fresh demo lab


pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def walkthrough() -> list[str]:
    """The commands of docs/checkpoints.md's block marked as tested, comments dropped."""
    text = (DOCS / "checkpoints.md").read_text()
    after = text.split(MARKER, 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block and after.index("```sh") < after.index("\n\n"), "the marked block must follow its marker"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_checkpoints_page_states_the_demo_recipes_defaults():
    recipe = next(r for r in load_lab(bundled_lab()).trainers if r.name == "demo-lora")
    defaults = {p.name: p.default for p in recipe.params}
    text = (DOCS / "checkpoints.md").read_text()
    assert f"`cetlab train demo-lora` runs {defaults['max_steps']} steps with a checkpoint every {defaults['save_steps']}" in text
    first = shlex.split(walkthrough()[0])
    assert first[:3] == ["cetlab", "train", "demo-lora"] and "--follow" in first


def test_the_checkpoint_walkthrough_runs_as_written(demo_lab):
    commands = walkthrough()
    assert [shlex.split(c)[1] for c in commands] == ["train", "checkpoints", "serve-checkpoint", "resume", "prune"]
    base = [sys.executable, "-m", "console.cli.main", "--lab", str(demo_lab.lab_path)]
    run_id = None
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "cetlab"
        if run_id:  # the demo lab of the test session may have run jobs before: its id, where the page says m5-1
            argv = [run_id if a == PAGE_RUN else a for a in argv]
        result = subprocess.run(base + argv[1:], capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, (
            f"`{command}` failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        outputs.append(result.stdout)
        if run_id is None:
            run_id = re.match(r"job (m5-\d+) \(demo-lora\)", result.stdout).group(1)
    served_model, resumed_job = (
        re.search(r"on model (\S+), warm at http", outputs[2]),
        re.search(r"^job (m5-\d+) ", outputs[3], re.M),
    )
    try:
        listing = outputs[1].splitlines()
        assert listing[0].startswith(f"run {run_id} on m5") and [int(row.split()[0]) for row in listing[2:]] == [160, 180, 200], (
            outputs[1]
        )
        assert served_model, outputs[2]  # "m5-1 step 200: merged on model m5-1-step200, warm at http://..."
        assert outputs[3].startswith(f"resumed {run_id} from step 180") and resumed_job, outputs[3]
        assert outputs[4].startswith(f"pruned run {run_id}: deleted "), outputs[4]
    finally:  # the session's demo lab goes on for other tests: stop what the walkthrough left running
        if resumed_job:
            subprocess.run(base + ["stop", resumed_job.group(1), "--kill"], capture_output=True, timeout=60)
        if served_model:
            subprocess.run(base + ["cold", served_model.group(1)], capture_output=True, timeout=120)


# ---------------------------------------------------------------------------- the gateway's curl examples, after a restart


def gateway_block() -> list[str]:
    """docs/gateway.md's examples up to the wake (continuation lines joined), placeholders as written."""
    text = (DOCS / "gateway.md").read_text()
    block = re.search(r"These do more:\n\n```sh\n(.*?)```", text, re.S)
    assert block, "docs/gateway.md's examples moved"
    joined = block.group(1).replace("\\\n", " ")
    lines = [line for line in joined.splitlines() if line.strip()]
    wake = next(i for i, line in enumerate(lines) if "wakes it" in line)
    return lines[: wake + 2]  # through the request after the comment that says it wakes


def cli(demo, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(demo.lab_path), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_gateway_wake_example_wakes_after_the_demo_restarted_warm(tmp_path):
    """Quit and restart returns the demo at its last rotation step, where phi-3-mini is warm: the example still wakes it."""
    from agents.shell.demo.lab import DemoLab

    with DemoLab(tmp_path / "demo") as demo:
        rotated = cli(demo, "rotate")  # to set 1: codellama-7b, llama-3.1-70b-4bit, phi-3-mini warm
        assert rotated.returncode == 0, rotated.stderr
    with DemoLab(tmp_path / "demo") as demo:
        lab = load_lab(demo.lab_path)
        script = "\n".join(
            line.replace("DIR", str(demo.dir))
            .replace("PORT", str(lab.gateway.port))
            .replace("cetlab --lab", f"{shlex.quote(sys.executable)} -m console.cli.main --lab")
            for line in gateway_block()
        )

        def back_up() -> bool:  # the restart brings phi-3-mini's machine back and the gateway's links connect (the
            # example itself warms phi-3-mini, and waits for it, before it puts it to sleep and wakes it)
            shown, gateway = cli(demo, "--json", "models"), cli(demo, "--json", "gateway")
            return (
                shown.returncode == gateway.returncode == 0
                and '"phi-3-mini"' in shown.stdout
                and all(link == "online" for link in json.loads(gateway.stdout)["peers"].values())
            )

        wait_until(back_up, timeout=300, interval=0.2)
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{script}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "x-cetlab-woke: true" in result.stdout.lower(), result.stdout[-3000:]


# ---------------------------------------------------------------------------- the multi-node run


def test_the_multi_node_run_runs_as_written(demo_lab):
    """`cetlab train ddp-2node --follow` from docs/training.md: one job over m5 and irina, exit 0 (EADDRINUSE on its first
    try once)."""
    text = (DOCS / "training.md").read_text()
    command = re.search(r"`(cetlab train ddp-2node[^`]*)`", text)
    assert command and "--follow" in command.group(1)
    argv = shlex.split(command.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(demo_lab.lab_path), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    job_id = re.match(r"job (m5-\d+) \(ddp-2node\)", result.stdout).group(1)

    def ended() -> dict | None:  # the coordinator hears of the other node's end at its next poll (every second)
        job = next(j for j in json.loads(cli(demo_lab, "--json", "jobs").stdout)["jobs"] if j["id"] == job_id)
        return job if all(n["state"] == "exited" for n in job["nodes"]) else None

    job = wait_until(ended, timeout=120, interval=0.2)
    assert job["state"] == "exited" and [n["state"] for n in job["nodes"]] == ["exited", "exited"], job
    listing = cli(demo_lab, "checkpoints", job_id)  # one run on shared storage: its name is enough
    assert listing.returncode == 0 and listing.stdout.startswith(f"run {job_id} on m5"), listing.stdout + listing.stderr
