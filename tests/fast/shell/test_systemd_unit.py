"""A unit GPU services survive: private /tmp, writable caches, nvidia-modprobe, a watchdog that fits the sample interval."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.runtime.waits import within
from agents.shell.systemd import Notifier, render_unit
from agents.wire.lab.model import load_lab
from tests.support.agent_process import one_machine_lab
from tests.support.systemd_unit import unit_lines


def test_watchdog_is_the_larger_of_its_default_and_two_sample_intervals(tmp_path):
    for interval, expected in ((1, 30), (20, 40), (60, 120)):
        path = one_machine_lab(tmp_path / f"lab{interval}.yaml")
        data = path.read_text().replace("name: box", f"name: box\n  sample_interval_s: {interval}", 1)
        path.write_text(data)
        lab = load_lab(path)
        assert lab.machines[0].sample_interval_s == interval
        unit = render_unit(lab, path, "box", Path("/var/lib/cetlab/box"), user_unit=True, run_as=None)
        assert unit_lines(unit)["WatchdogSec"] == [str(expected)]


def stub_agent(interval_s: float) -> SimpleNamespace:
    return SimpleNamespace(ticks=1, interval_s=interval_s, peers=[], current={}, latest=None, simulated=True)


@pytest.mark.timeout(60)
async def test_a_slow_sampler_is_not_taken_for_a_stuck_one(tmp_path):
    """sample_interval_s 60 ticks once a minute: the pings go on past WatchdogSec, until two intervals pass."""
    name = f"cetlab-test-{uuid.uuid4().hex[:12]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": f"@{name}", "WATCHDOG_USEC": "200000"})  # WatchdogSec=0.2 s
    started = time.monotonic()
    task = asyncio.create_task(notifier.run([stub_agent(60.0)]))
    late_pings = 0
    try:
        loop = asyncio.get_running_loop()
        while late_pings < 3:  # pings well after WatchdogSec without a tick
            message = (await within(loop.sock_recv(sock, 4096), 10)).decode()
            if "WATCHDOG=1" in message.splitlines() and time.monotonic() - started > 3 * notifier.watchdog_s:
                late_pings += 1
    finally:
        task.cancel()
        sock.close()


def test_the_agents_command_line_is_the_one_its_parser_reads():
    """agent_argv (the unit's, machine add's, the demo's, the benches' and the tests' one spelling) against the
    daemon's own parser: every option it writes lands where `serve` reads it."""
    from agents.shell.daemon import build_parser
    from agents.wire.agent_argv import agent_argv, python_agent

    argv = agent_argv(
        python_agent("python3"),
        "/l/lab.yaml",
        ["m5", "irina"],
        "/s",
        log_level="warning",
        keep_engines=True,
        unix_socket="/s/agent.sock",
        parent_pid=42,
        extra=["--metrics-port", "9400"],
    )
    assert argv[:3] == ["python3", "-m", "agents.shell.daemon"]
    args = build_parser().parse_args(argv[3:])
    assert (args.command, args.log_level, args.lab, args.machine, args.state_dir) == (
        "serve",
        "warning",
        "/l/lab.yaml",
        ["m5", "irina"],
        "/s",
    )
    assert (args.keep_engines, args.unix_socket, args.parent_pid, args.metrics_port) == (True, "/s/agent.sock", 42, 9400)
    plain = build_parser().parse_args(agent_argv(["cetlab-agent"], "lab.yaml", "box", "/s")[1:])
    assert (plain.machine, plain.keep_engines, plain.unix_socket, plain.log_level) == (["box"], False, None, "info")
