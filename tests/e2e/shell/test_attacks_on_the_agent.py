"""Attacks on a real agent over loopback (issue 11, findings 5, 6, 7): a legitimate console keeps its pings and ticks.

Each attack runs a few seconds against an agent limited to 1,024 fds; the figures are printed (bench/bench_attacks.py
prints them over longer windows); the assertions are the bounded ones: every ping answered, ticks keep coming,
fds and memory bounded, the operator's rows intact.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from agents.wire.lab.model import load_lab
from bench.bench_attacks import Console, DemoLab, add_viewer, launch_agent, measure, report

SECONDS = 4.0


LAB = {"lab": "attacks", "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}]}


@pytest.fixture
async def target(tmp_path, lab_file):
    """(demo, agent process, legitimate console, viewer key) with the agent under systemd's default fd limit."""
    demo = DemoLab(tmp_path / "run", source=lab_file(LAB))
    demo.prepare()
    viewer = add_viewer(demo, tmp_path)
    agent = launch_agent(demo)
    demo.processes.append(agent)
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


def assert_console_kept_going(figures: dict) -> None:
    during = figures["during"]
    assert not during.failures, during.failures[:3]
    assert len(during.pings_ms) >= 10  # answered all along, not once at the end
    assert len(during.tick_times) >= SECONDS / 2 and during.max_gap_s() < SECONDS / 2 + 1  # ticks kept coming


@pytest.mark.timeout(180)
async def test_an_idle_connection_flood_does_not_keep_an_operator_out(target):
    demo, agent, console, viewer = target
    figures = await measure(demo, agent.pid, console, viewer, "5 idle TCP flood", SECONDS)
    print("\n" + report(figures))
    assert figures["flood_opened"] >= 1000
    assert figures["late_console_online"] and figures["late_console_jobs_list"] == "ok"
    assert_console_kept_going(figures)
    assert figures["fds"][1] < 200  # not one fd per idle connection
    assert "Too many open files" not in (demo.dir / "agent.log").read_text()


@pytest.mark.timeout(120)
async def test_a_connection_that_never_logs_in_is_closed(target):
    demo, agent, console, viewer = target
    port = load_lab(demo.lab_path).machine("box").port
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)
    started = time.monotonic()
    try:
        banner = s.recv(256)
        assert banner.startswith(b"SSH-2.0-")
        while s.recv(4096):  # say nothing; the agent closes it at its login timeout (asyncssh's default: 120 s)
            pass
        print(f"\nclosed {time.monotonic() - started:.1f} s after connecting")
    finally:
        s.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("attack", ["6 history, unread", "6 subscribe topics", "6 1,000 channels"])
async def test_costly_requests_do_not_stall_another_console(target, attack):
    demo, agent, console, viewer = target
    figures = await measure(demo, agent.pid, console, viewer, attack, SECONDS)
    print("\n" + report(figures))
    assert_console_kept_going(figures)
    assert figures["rss_mb"][1] < figures["rss_mb"][0] + 50  # nothing kept for the attacker
    if attack == "6 history, unread":  # the budget: a 3,600-point history costs 101 pings, 200 a second refill it
        assert figures["history_answers"].get("ran", 0) <= 4 + 2 * (SECONDS + 4)
        assert figures["history_answers"].get("rate_limited", 0) > 0
    if attack == "6 1,000 channels":
        assert figures["channels_opened"] <= 4 and figures["channels_refused"] >= 995
    if attack == "6 subscribe topics":
        assert "invalid_params" in figures["subscribe_answers"]  # never taken (and past the budget, not even parsed)
        assert set(figures["subscribe_answers"]) <= {"invalid_params", "rate_limited"}


@pytest.mark.timeout(180)
async def test_refused_calls_never_push_an_operators_action_out_of_the_trail(target):
    demo, agent, console, viewer = target
    client = console.client
    await client.call("box", "set_interval", {"interval_s": 1.0})
    before = await client.call("box", "audit.list", {"limit": 5000})
    figures = await measure(demo, agent.pid, console, viewer, "7 refused calls", SECONDS)
    print("\n" + report(figures))
    assert_console_kept_going(figures)
    refused = figures["refusal_codes"].get("forbidden", 0)
    assert refused >= 200
    after = await client.call("box", "audit.list", {"limit": 5000, "who": "mallory"})
    assert after["entries"] == []  # no row per refusal ...
    assert sum(r["count"] for r in after["refusals"]) >= refused  # ... but every one counted (the attacker left some unread)
    assert len(after["refusals"]) <= 3
    ours = await client.call("box", "audit.list", {"limit": 5000})
    assert ours["entries"] == before["entries"] and ours["total"] == before["total"]
