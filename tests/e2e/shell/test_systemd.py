"""Headless agents: the systemd unit (verified), sd_notify READY/STATUS/WATCHDOG from a real agent, doctor."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from agents.runtime.keys import HOST_KEY_NAME, ensure_key
from tests.support.agent_process import PY, one_machine_lab, start_agent


def agent_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "agents.shell.daemon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_unit_file_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    lab_path = one_machine_lab(
        tmp_path / "lab.yaml",
        trainers=[{"name": "t", "machine": "box", "command": [PY, "-c", "pass"], "output_dir": "runs/{job_id}"}],
    )
    result = agent_cli("install-unit", "--lab", str(lab_path), "--machine", "box", "--print")
    assert result.returncode == 0, result.stderr
    unit = result.stdout
    for line in (
        "Type=notify",
        "WatchdogSec=30",
        "Restart=on-failure",
        "KillMode=process",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "--keep-engines",
        "StateDirectory=cetlab/box",
    ):
        assert line in unit, line
    assert f"-{tmp_path / 'runs'}" in unit  # the trainers' outputs stay writable
    for closes_dev in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock="):
        assert not any(line.startswith(closes_dev) for line in unit.splitlines()), closes_dev
    path = tmp_path / "cetlab-agent.service"
    path.write_text(unit)
    verify = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stderr
    # verify only warns (exit 0) on unknown keys and bad values: no line may name our file
    assert str(path) not in verify.stderr, verify.stderr


def test_install_user_unit_writes_it_and_prints_the_commands(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    result = agent_cli(
        "install-unit", "--user", "--lab", str(lab_path), "--machine", "box", env={"XDG_CONFIG_HOME": str(tmp_path / "config")}
    )
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "config" / "systemd" / "user" / "cetlab-agent.service"
    assert "Type=notify" in unit.read_text() and "WantedBy=default.target" in unit.read_text()
    assert "ProtectSystem" not in unit.read_text()  # a user manager cannot set up those mounts
    assert "systemctl --user enable --now cetlab-agent.service" in result.stdout
    assert "loginctl enable-linger" in result.stdout


def test_unknown_machine_is_a_clear_error(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    result = agent_cli("install-unit", "--lab", str(lab_path), "--machine", "nope", "--print")
    assert result.returncode == 2
    assert "no machine named 'nope'" in result.stderr and "box" in result.stderr


def _receive(sock: socket.socket, until: str, timeout: float = 30.0) -> list[str]:
    """Datagrams until one holds `until` (a KEY=value line)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
        if any(until in message.splitlines() for message in got[-1:]):
            return got
    raise AssertionError(f"no {until} within {timeout} s; got {got}")


@pytest.mark.timeout(90)
def test_real_agent_notifies_ready_status_watchdog_and_stopping(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    name = f"cetlab-test-{uuid.uuid4().hex[:12]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)  # the abstract namespace, as systemd may hand out ('@' in NOTIFY_SOCKET)
    proc = start_agent(lab_path, tmp_path / "state", env={"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "1000000"})
    try:
        ready = _receive(sock, "READY=1")
        fields = dict(line.split("=", 1) for line in ready[-1].splitlines())
        assert fields["MAINPID"] == str(proc.pid)
        assert "2 GPUs" in fields["STATUS"] and "sampling 1 Hz" in fields["STATUS"] and "0 consoles" in fields["STATUS"]
        pings = 0
        while pings < 3:  # WatchdogSec=1 s: a ping every half second
            pings += sum("WATCHDOG=1" in m.splitlines() for m in _receive(sock, "WATCHDOG=1", timeout=10))
        proc.send_signal(signal.SIGTERM)
        stopping = _receive(sock, "STOPPING=1", timeout=20)
        assert "STATUS=stopping" in stopping[-1]
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_doctor_fails_on_a_readable_host_key_and_passes_when_fixed(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    ensure_key(state / HOST_KEY_NAME)
    (state / HOST_KEY_NAME).chmod(0o644)
    result = agent_cli("doctor", "--lab", str(lab_path), "--machine", "box", "--state-dir", str(state), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False
    assert checks["host key"]["level"] == "FAIL" and "chmod 600" in (checks["host key"]["fix"] or "")
    assert checks["gpus"]["level"] == "OK" and "SIMULATED" in checks["gpus"]["message"]
    assert {"torch", "vllm", "state dir", "disk", "time sync", "authorized keys"} <= set(checks)
    (state / HOST_KEY_NAME).chmod(0o600)
    result = agent_cli("doctor", "--lab", str(lab_path), "--machine", "box", "--state-dir", str(state))
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if not line.lstrip().startswith("fix:")]  # a WARN's fix line
    assert all(line.split()[0] in ("OK", "WARN") for line in lines), lines
    assert any(line.startswith("WARN") and "authorized keys" in line for line in lines)  # nobody can log in yet


@pytest.mark.needs_no_gpu  # on a GPU machine the same check is OK
def test_doctor_fails_on_nvml_machine_without_driver(tmp_path):
    lab_path = tmp_path / "lab.yaml"
    lab_path.write_text(yaml.safe_dump({"lab": "hardening", "machines": [{"name": "box", "gpus": "nvml"}]}))
    result = agent_cli("doctor", "--lab", str(lab_path), "--machine", "box", "--state-dir", str(tmp_path / "s"))
    gpus = next(line for line in result.stdout.splitlines() if line.split()[1] == "gpus")
    assert result.returncode == 1 and gpus.startswith("FAIL") and "no NVIDIA GPUs" in gpus, result.stdout
