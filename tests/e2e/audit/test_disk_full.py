"""A full disk under the audit trail: an operator action is refused, never done without its row."""

from __future__ import annotations

import resource
import subprocess

import pytest
import yaml

from agents.shell.demo.lab import DemoLab
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.agent_process import PY, connected, one_machine_lab, start_agent, wait_listening
from tests.support.waits import wait_for

# The largest file the agent may write: state.db (~110 KB) and some sixty WAL frames.
FILE_SIZE_LIMIT = 256 * 1024


def start_agent_on_full_disk(lab_path, state, limit: int = FILE_SIZE_LIMIT) -> subprocess.Popen:
    """The agent with RLIMIT_FSIZE: every write past the limit fails as on a full disk (Python ignores SIGXFSZ)."""

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.Popen(
        agent_argv(python_agent(PY), lab_path, "box", state, log_level="warning"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=full_disk,
    )


def agent_on_a_disk_that_fills(tmp_path, lab) -> tuple[DemoLab, subprocess.Popen]:
    """The lab's agent started once with room (state.db and its tables), then again on a disk that fills; listening."""
    demo = DemoLab(tmp_path / "run", source=lab)
    demo.prepare()  # keys and known_hosts; the agent is ours to start
    port = yaml.safe_load(demo.lab_path.read_text())["machines"][0]["port"]
    first = start_agent(demo.lab_path, demo.dir / "agents" / "box")
    wait_listening("127.0.0.1", port, first)
    first.terminate()
    assert first.wait(timeout=30) == 0
    agent = start_agent_on_full_disk(demo.lab_path, demo.dir / "agents" / "box")
    try:
        wait_listening("127.0.0.1", port, agent)
    except BaseException:
        agent.kill()
        raise
    return demo, agent


@pytest.mark.timeout(120)
async def test_an_operator_action_is_refused_when_its_audit_row_cannot_be_written(tmp_path):
    demo, agent = agent_on_a_disk_that_fills(tmp_path, one_machine_lab(tmp_path / "lab.yaml"))
    try:
        client = await connected(demo.lab_path)
        try:
            applied, refused = None, None
            for n in range(200):  # each action writes its row first: the WAL grows until the limit
                interval = 1.0 + (n % 50) / 100
                try:
                    await client.call("box", "set_interval", {"interval_s": interval})
                    applied = interval
                except RemoteError as exc:
                    refused = (interval, exc)
                    break
            assert refused is not None, "200 actions and the trail never filled the disk"
            interval, exc = refused
            assert exc.code == ErrorCode.UNAVAILABLE and "audit trail cannot be written" in exc.message, exc
            print(f"\nrefused after {n} actions: {exc.message}")
            hello = await client.call("box", "hello")
            assert hello["sample_interval_s"] == applied != interval  # the refused action was not done
            assert "t" in await client.call("box", "ping")  # and the agent serves on
        finally:
            await client.stop()
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def test_a_full_disk_at_start_is_one_line_not_a_traceback(tmp_path):
    agent = start_agent_on_full_disk(one_machine_lab(tmp_path / "lab.yaml"), tmp_path / "state", limit=16 * 1024)
    assert agent.wait(timeout=60) == 1
    lines = agent.stderr.read().decode().strip().splitlines()
    assert len(lines) == 1 and "state.db" in lines[0] and "disk" in lines[0], lines


@pytest.mark.timeout(120)
async def test_the_ledger_on_a_full_disk_keeps_the_agent_ticking_and_raises_the_disk_alert(tmp_path):
    """Issue 11 finding 12: on a full disk the energy ledger cannot book. That is said (the disk alert on state.db,
    one log line per episode), and everything else goes on: ticks, status, costs of what was booked."""
    lab = one_machine_lab(tmp_path / "lab.yaml")
    data = yaml.safe_load(lab.read_text())
    data["machines"][0]["sample_interval_s"] = 0.1  # ten ledger transactions a second: the disk fills in seconds
    lab.write_text(yaml.safe_dump(data))
    demo, agent = agent_on_a_disk_that_fills(tmp_path, lab)
    try:
        client = await connected(demo.lab_path)
        try:
            view = client.state.machines["box"]

            def disk_alert():  # on every console (the tick's alerts section); its history row cannot be written
                return next((a for a in view.alerts.active if a.rule == "disk_full" and a.target == "state.db"), None)

            alert = await wait_for(disk_alert, timeout=60)
            assert "disk full" in alert.message and alert.level == "critical", alert
            seen = view.sample_t
            await wait_for(lambda: view.sample_t and view.sample_t > seen, timeout=10)  # ticks go on
            costs = await client.call("box", "costs.get", {})
            assert costs["now"]["power_w"] is not None  # costs answers from what was booked
        finally:
            await client.stop()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    log = agent.stderr.read().decode()
    assert log.count("the ledger cannot book") == 1 and "Traceback" not in log, log[-3000:]
