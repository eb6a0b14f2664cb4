"""`cetlab lab doctor` (doctor.run on every machine, one matrix), and a console newer than an agent (issue 29 items 4, 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agents import __version__
from agents.shell import doctor_method
from agents.shell.doctor import FAIL
from agents.wire.catalogue.doctor import DOCTOR_RUN, DoctorParams
from agents.wire.catalogue.method import request
from agents.wire.entry import EXIT_BROKEN_PIPE
from tests.support.lab import REPO
from tests.support.lab_doctor import TWO, connected
from tests.support.waits import wait_for


async def test_doctor_run_answers_the_machines_checks_and_its_peer_links_with_their_fix(in_process):
    lab = await in_process(TWO, machines=["box"])
    client = await connected(lab)
    report = await request(client, "box", DOCTOR_RUN, DoctorParams(timeout_s=60), timeout=90)
    assert report.machine == "box" and report.agent_version == __version__ and report.complete
    checks = {c.name: c for c in report.checks}
    assert checks["gpus"].level == "OK" and "SIMULATED" in checks["gpus"].message
    assert checks["state dir"].level == "OK"  # the running agent's own state dir, mode 700
    assert checks["torch"].level in ("OK", "WARN") and "precision cuda:0" not in checks  # read in a subprocess

    # the gateway on box needs ghost (no agent there): box's side of the pair, with the command that fixes it
    def ghost_link():
        found = {c.name: c for c in doctor_method.peer_checks(lab.agents["box"])}.get("peer → ghost")
        return found if found is not None and found.level == FAIL else None

    peer = await wait_for(ghost_link)
    assert peer.name == "peer → ghost" and "gateway link to ghost" in peer.message
    assert "peer → ghost" in checks
    assert checks["peer file peer_ed25519_key"].level == "OK"  # made at the gateway's start, mode 600
    key = lab.agents["box"].state_dir / "peer_ed25519_key"
    key.chmod(0o644)
    opened = {c.name: c for c in doctor_method.peer_checks(lab.agents["box"])}["peer file peer_ed25519_key"]
    assert opened.level == FAIL and opened.fix == f"chmod 600 {key}"


# ---------------------------------------------------------------------------- the agent's CLI (issue 32 item 10)


def agent_cli(*args: str, cwd, stdout=subprocess.PIPE) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "agents.shell.daemon", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )


def test_a_bare_doctor_where_lab_yaml_names_no_machine_like_this_host_runs_the_preflight(tmp_path, lab_file):
    lab_file({"lab": "t", "machines": [{"name": "not-this-host", "gpus": "none"}]})
    proc = agent_cli("doctor", "--json", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err  # before: exit 2, "no machine named like this host"
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["lab.yaml"]["level"] == "WARN" and "its machines: not-this-host" in checks["lab.yaml"]["message"]
    assert checks["lab.yaml"]["fix"] == "cetlab-agent doctor --lab lab.yaml --machine not-this-host"
    assert {"gpus", "torch", "disk"} <= set(checks)


def test_the_agents_cli_exits_quietly_when_its_reader_has_gone(tmp_path, lab_file):
    """`cetlab-agent doctor | head -3`: the reader leaves; before, a "Broken pipe" error and exit 1."""
    lab = lab_file()
    proc = agent_cli("doctor", "--lab", str(lab), "--machine", "box", "--state-dir", str(tmp_path / "s"), cwd=tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before a byte is written: every write the doctor makes meets a closed pipe
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE and err == ""


def test_lab_doctor_over_ssh_asks_the_running_agent(small_demo):
    """The whole path: the CLI, SSH, the agent's operator method, its checks in a thread, the matrix and --json."""
    done = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "--lab", str(small_demo.lab_path), "--json", "lab", "doctor"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    data = json.loads(done.stdout)
    box = data["machines"]["box"]
    assert box["reached"] and box["agent_version"] == __version__ and box["complete"], done.stdout + done.stderr
    checks = {c["name"]: c for c in box["checks"]}
    assert checks["agent port"]["message"].endswith("held by this agent")  # its own port, not a conflict
    assert checks["host key"]["level"] == "OK" and checks["authorized keys"]["level"] == "OK"
    assert done.returncode == (0 if data["ok"] else 1)
