"""Headless agents: the systemd unit (verified), sd_notify READY/STATUS/WATCHDOG from a real agent, doctor."""

from __future__ import annotations

import socket
from pathlib import Path

from agents.shell.systemd import Notifier, render_unit
from agents.wire.lab.model import load_lab
from tests.support.agent_process import one_machine_lab


def test_notifier_path_socket_and_watchdog_env(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "30000000"})
        assert notifier.enabled and notifier.watchdog_s == 30.0
        notifier.send(READY=1, STATUS="3 consoles, 2 jobs")
        sock.settimeout(5)
        assert sock.recv(4096) == b"READY=1\nSTATUS=3 consoles, 2 jobs"
    finally:
        sock.close()
    assert not Notifier({}).enabled  # not under systemd: silent
    assert (
        Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    )  # meant for another pid
    Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).send(READY=1)  # systemd gone: a warning, no crash


def test_unit_names_the_unix_socket_and_user(tmp_path):
    lab = load_lab(one_machine_lab(tmp_path / "lab.yaml"))
    unit = render_unit(
        lab,
        tmp_path / "lab.yaml",
        "box",
        Path("/srv/cetlab"),
        user_unit=False,
        run_as="cetlab",
        unix_socket=Path("/run/cetlab/agent.sock"),
    )
    assert "User=cetlab" in unit and "--unix-socket /run/cetlab/agent.sock" in unit
    assert "StateDirectory" not in unit  # only under /var/lib
    assert "ReadWritePaths=/srv/cetlab" in unit
