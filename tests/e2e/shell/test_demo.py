"""The demo lab's set-up: a complete client-side lab.yaml, keys, known_hosts; --scale emulation; its own process."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agents.runtime.demo import GATEWAY_KEY_FILE
from agents.shell.demo.lab import DemoLab, DemoRunningError
from agents.wire.lab.model import load_lab
from tests.support.waits import wait_until


def test_prepare_writes_a_complete_lab(tmp_path):
    demo = DemoLab(tmp_path / "d")
    lab = load_lab(demo.prepare())
    assert [m.name for m in lab.machines] == ["m5", "irina", "workstation", "pharaoh"]
    assert all(m.host == "127.0.0.1" for m in lab.machines)
    assert len({m.port for m in lab.machines}) == 4
    key = lab.resolve(lab.console.key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    known = lab.resolve(lab.console.known_hosts).read_text().splitlines()
    assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{m.port}" for m in lab.machines]
    assert (tmp_path / "d" / "demo" / "train.jsonl").exists()  # the demo recipe's assets travel with it


def test_the_demos_runs_and_models_live_in_its_folder_and_older_state_moves_up(tmp_path):
    directory = tmp_path / "d"
    old_run = directory / ".cetlab-demo" / "runs" / "m5-1" / "checkpoint-2"  # where runs went before
    old_run.mkdir(parents=True)
    (directory / ".cetlab-demo" / "tiny-llama").mkdir()
    lab = load_lab(DemoLab(directory).prepare())
    recipe = next(t for t in lab.trainers if t.name == "demo-lora")
    assert lab.resolve(recipe.output_dir) == directory / "runs" / "{job_id}"
    assert lab.resolve(next(m for m in lab.models if m.name == "tiny-llama").path) == directory / "tiny-llama"
    assert [lab.resolve(d.path) for d in lab.checkpoints.dirs] == [directory / "out"]
    assert (directory / "runs" / "m5-1" / "checkpoint-2").is_dir() and (directory / "tiny-llama").is_dir()
    # the old paths (in job records, in adapters' base_model) still lead there
    assert old_run.resolve() == (directory / "runs" / "m5-1" / "checkpoint-2").resolve()
    train = (directory / "demo" / "train.yaml").read_text()  # the recipe's config names the same tiny model
    assert "base_model: ../tiny-llama" in train and ".cetlab-demo" not in train.split("base_model:", 1)[1].splitlines()[0]
    DemoLab(directory).prepare()  # a second start: nothing more to move
    assert (directory / "runs" / "m5-1" / "checkpoint-2").is_dir()


def test_the_demo_says_its_gateways_url_and_key_and_why_the_port_is_not_lab_yamls(tmp_path, monkeypatch):
    from agents.runtime.demo import ANY_GATEWAY_PORT_ENV
    from console.lab.demo import bundled_lab, demo_quit_message, describe_gateway

    named = load_lab(bundled_lab()).gateway
    assert named is not None
    monkeypatch.delenv(ANY_GATEWAY_PORT_ENV, raising=False)
    with socket.socket() as taken:  # lab.yaml's port held by someone else: the demo takes another and says why
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", named.port))
        except OSError:
            pass  # already taken by another: the same case
        taken.listen()
        directory = tmp_path / "d"
        lab_path = DemoLab(directory).prepare()
    gateway = load_lab(lab_path).gateway
    assert gateway is not None and gateway.port != named.port
    said = describe_gateway(directory, lab_path, bundled_lab())
    key = directory / GATEWAY_KEY_FILE
    assert f"gateway: {gateway.url} (key in {key}; not lab.yaml's port {named.port}: it was taken)" in said, said
    quit_text = demo_quit_message(directory, describe_gateway(directory, lab_path, bundled_lab(), try_line=False))
    assert f"gateway: {gateway.url} (key in {key}" in quit_text and "try: curl" not in quit_text, quit_text


def test_scale_emulates_machines_of_eight_gpus(tmp_path):
    lab = load_lab(DemoLab(tmp_path / "s", scale=3).prepare())
    assert [m.name for m in lab.machines] == ["node000", "node001", "node002"]
    assert all(len(m.gpus.sim) == 8 for m in lab.machines)
    assert not lab.models and not lab.trainers  # they name the demo lab's machines


def test_scale_256_writes_a_lab_file_that_loads(tmp_path):
    """The issue's benchmark lab: 256 machines (once refused for its 256 YAML aliases of one shared GPU list)."""
    path = DemoLab(tmp_path / "big", scale=256).prepare()
    assert "*" not in path.read_text()  # a plain file, one GPU list per machine
    lab = load_lab(path)
    assert len(lab.machines) == 256 and sum(len(m.gpus.sim) for m in lab.machines) == 2048


def start_headless(directory: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`cetlab demo --dir DIR` as a person runs it; its lines up to "stop with Ctrl-C" (it is running then)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "console.cli.main", "demo", "--dir", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or "stop with Ctrl-C" not in lines[-1]:
        line = process.stdout.readline()
        assert line, f"cetlab demo exited ({process.wait()}) before it ran: {lines}"
        lines.append(line.rstrip("\n"))
    return process, lines


def folder_free(directory: Path) -> bool:
    """True when no demo's process holds DIR (the lock its process keeps while its agents run)."""
    demo = DemoLab(directory)
    try:
        demo.lock()
    except DemoRunningError:
        return False
    demo.unlock()
    return True


def test_cetlab_demo_runs_the_lab_in_its_own_process_until_ctrl_c(tmp_path):
    directory = tmp_path / "d"
    process, lines = start_headless(directory)
    try:
        said = "\n".join(lines)
        assert f"demo lab running: {directory / 'lab.yaml'}" in said
        lab = load_lab(directory / "lab.yaml")
        assert lab.gateway is not None
        assert f"gateway: {lab.gateway.url} (key in {directory / GATEWAY_KEY_FILE}" in said
        assert (directory / GATEWAY_KEY_FILE).read_text().strip()
        assert not folder_free(directory)  # held by the demo's process, not by `cetlab demo` itself
        status = subprocess.run(
            [sys.executable, "-m", "console.cli.main", "--lab", str(directory / "lab.yaml"), "--json", "status"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert [m["online"] for m in json.loads(status.stdout)["machines"]] == [True] * len(lab.machines)
        assert "not lab.yaml's port 8400: CETLAB_DEMO_ANY_GATEWAY_PORT is set" in said, said  # tests run with it set
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C
        assert process.wait(timeout=60) == 0
    assert process.stdout is not None
    after = process.stdout.read()
    assert "the demo lab stopped" in after and f"gateway: {lab.gateway.url} (key in" in after, after  # said again on quit
    assert folder_free(directory)  # its process stopped the agents and let the folder go
    for machine in lab.machines:
        with pytest.raises(OSError):
            socket.create_connection((machine.host, machine.port), timeout=2).close()
    logs = list((directory / "agents").glob("*.log"))
    assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs), logs


def test_the_demo_process_follows_its_console_even_when_killed(tmp_path):
    directory = tmp_path / "d"
    process, _ = start_headless(directory)
    process.kill()  # no chance to stop its child: the child watches its pid
    process.wait()
    wait_until(lambda: folder_free(directory), timeout=60, what="the demo's process stopped after its console died")
