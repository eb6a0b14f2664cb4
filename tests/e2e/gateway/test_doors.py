"""The doors (issue 21, N3, N8 and N10): its port cannot bring back the idle-connection flood (H2), and a key that
abandons its requests cannot keep the engine from a legitimate client. A real agent with systemd's 1,024 fds, serving
the gateway; a legitimate console and gateway client measured while the attack runs (bench/bench_attacks.py prints
the same figures over longer windows).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import yaml

from agents.wire.lab.model import load_lab
from bench.bench_attacks import LAB, Console, DemoLab, add_viewer, launch_agent, launch_stand_ins, measure, report

SECONDS = 4.0


@pytest.fixture
async def gateway_target(tmp_path, lab_file):
    """(demo, agent process, legitimate console, viewer key): the bench's lab, its gateway's first-request deadline 2 s."""
    data = yaml.safe_load(LAB)
    data["gateway"]["policies"] = {"first_request_s": 2}
    demo = DemoLab(tmp_path / "run", source=lab_file(data))
    demo.prepare()
    viewer = add_viewer(demo, tmp_path)
    agent = launch_agent(demo)
    demo.processes.append(agent)
    stand_ins = launch_stand_ins(demo)
    console = None
    try:
        await asyncio.to_thread(demo.wait_listening)
        console = Console(demo)
        await console.start()
        yield demo, agent, console, viewer
    finally:
        if console is not None:
            await console.stop()
        agent.terminate()
        agent.wait(timeout=30)
        for proc in stand_ins:
            proc.terminate()
            proc.wait(timeout=10)


def assert_kept_going(figures: dict) -> None:
    quiet, during = figures["quiet"], figures["during"]
    assert not during.failures, during.failures[:3]
    assert len(during.pings_ms) >= 10
    assert len(during.tick_times) >= SECONDS / 2 and during.max_gap_s() < SECONDS / 2 + 1
    assert quiet.gateway_ms and not quiet.gateway_failures, quiet.gateway_failures[:3]
    assert len(during.gateway_ms) >= 5 and len(during.gateway_failures) <= 1, during.gateway_failures[:3]


@pytest.mark.timeout(240)
async def test_an_idle_flood_of_the_gateway_port_keeps_ssh_ticks_and_gateway_clients(gateway_target):
    demo, agent, console, viewer = gateway_target
    figures = await measure(demo, agent.pid, console, viewer, "N3 gateway idle flood", SECONDS)
    print("\n" + report(figures))
    assert figures["flood_opened"] >= 1000
    assert figures["late_console_online"] and figures["late_console_jobs_list"] == "ok"
    assert figures["late_gateway_status"] == 200
    assert_kept_going(figures)
    assert figures["fds"][1] < 400  # before: one fd per connection, 1,024 reached
    assert figures["flood_closed_by_gateway"] >= 900  # evicted at the cap, or closed at the first-request deadline
    log = (demo.dir / "agent.log").read_text()
    assert "Too many open files" not in log and log.count("\n") < 50  # before: ~35,000 accept errors in 40 s


@pytest.mark.timeout(120)
async def test_a_gateway_connection_that_sends_no_request_or_half_a_head_is_closed(gateway_target):
    demo = gateway_target[0]
    port = load_lab(demo.lab_path).gateway.port
    for opening in (b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"):  # nothing; a head that never ends
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(30)
        started = time.monotonic()
        try:
            s.sendall(opening)
            while s.recv(4096):
                pass
            closed_after = time.monotonic() - started
        finally:
            s.close()
        print(f"\n{opening[:20]!r}: closed {closed_after:.1f} s after connecting")
        assert closed_after < 20  # before: held for good


@pytest.mark.timeout(240)
async def test_a_key_abandoning_its_requests_does_not_slow_another_client(gateway_target):
    demo, agent, console, viewer = gateway_target
    figures = await measure(demo, agent.pid, console, viewer, "N8 abandoned requests", SECONDS)
    print("\n" + report(figures))
    assert_kept_going(figures)
    codes = figures["abandoned_codes"]
    assert codes.get("429", 0) > codes.get("left", 0)  # at most 4 in flight for the key; the rest refused at once


@pytest.mark.timeout(240)
async def test_a_storm_of_idle_connections_from_the_consoles_own_address_keeps_logins_working(gateway_target):
    """N10: the login door closes a silent connection for room, never a console in its handshake."""
    demo, agent, console, viewer = gateway_target
    figures = await measure(demo, agent.pid, console, viewer, "N10 login storm", SECONDS)
    print("\n" + report(figures))
    during = figures["during"]
    assert figures["storm_opened"] >= 1000
    tried = len(during.logins_ms) + len(during.login_failures)
    # before: 26% failed at 2,000 a second; now a login fails only when the agent reads its version line later than
    # 32 newer connections arrive (rare; a real console retries)
    assert tried >= 3 and len(during.login_failures) <= tried // 10, during.login_failures[:3]
    assert not during.failures and during.max_gap_s() < SECONDS / 2 + 1


@pytest.mark.timeout(240)
async def test_a_storm_of_version_lines_from_the_consoles_own_address_keeps_every_login_working(gateway_target):
    """R10 (issue 30): connections that send an SSH version line and nothing more (no key needed) were protected for
    2 s, so the newest, the real console, was turned away (16 of 23 logins failed at 50 a second). The door closes the
    oldest that has not begun a key exchange for room: every login of a console in the storm succeeds."""
    demo, agent, console, viewer = gateway_target
    figures = await measure(demo, agent.pid, console, viewer, "R10 version-line storm", SECONDS)
    print("\n" + report(figures))
    during = figures["during"]
    assert figures["storm_opened"] >= 1000
    assert len(during.logins_ms) >= 3 and not during.login_failures, during.login_failures[:3]
    assert not during.failures and during.max_gap_s() < SECONDS / 2 + 1
