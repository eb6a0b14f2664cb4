"""One budget per principal (issue 30, R6): a uid on the unix socket is capped as a key is over SSH: connections,
channels, calls per second and unread replies, in the one tally every transport shares. A real agent in this event
loop, its real unix socket."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from agents.runtime.limits import KEY_BUDGET_BURST, KEY_BUDGET_PER_S, MAX_CONNECTIONS_PER_KEY
from agents.runtime.principals import Principals, uid_principal
from agents.runtime.waits import within
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)


PING = b'{"id": 1, "method": "ping"}\n'


async def test_one_uid_on_the_socket_is_capped_and_a_console_is_still_answered(in_process):
    lab = await in_process()
    agent = lab.agents["box"]
    assert agent._unix_server is not None, f"the socket path is too long here: {agent.unix_socket}"
    console = lab.client(who="operator console")
    await console.start()
    await console.wait_connected(10)
    opened = [await asyncio.open_unix_connection(str(agent.unix_socket)) for _ in range(100)]
    try:
        served, refused = [], 0
        for reader, writer in opened:
            try:
                writer.write(PING)
                answer = json.loads(await within(reader.readline(), 10))
            except (ConnectionError, json.JSONDecodeError):  # closed by the agent (its refusal line came first)
                answer = {}
            if "result" in answer:
                served.append((reader, writer))
            else:
                refused += 1
        probe, probe_writer = await asyncio.open_unix_connection(str(agent.unix_socket))  # says nothing: hears why
        opened.append((probe, probe_writer))
        why = json.loads(await within(probe.readline(), 10))["error"]
        print(f"\n100 socket connections of one uid: {len(served)} served, {refused} refused: {why}")
        assert len(served) == MAX_CONNECTIONS_PER_KEY  # before: all 100 (the socket applied no per-principal cap)
        assert why["code"] == "rate_limited" and "connections open" in why["message"]
        assert agent.principals.refused["connection"] == 101 - MAX_CONNECTIONS_PER_KEY

        # the served ones share one budget: 200 pings each is within each connection's own, not within the uid's
        started = time.monotonic()
        for _, writer in served:
            writer.write(PING * 200)
        codes: dict[str, int] = {}

        async def read(reader: asyncio.StreamReader) -> None:
            for _ in range(200):
                code = json.loads(await within(reader.readline(), 30)).get("error", {}).get("code", "ok")
                codes[code] = codes.get(code, 0) + 1

        ping = asyncio.ensure_future(console.call("box", "ping"))
        await asyncio.gather(*(read(reader) for reader, _ in served))
        elapsed = time.monotonic() - started
        print(f"{len(served)} x 200 pings in {elapsed:.1f} s: {codes}")
        assert codes.get("rate_limited", 0) > 0 and agent.principals.refused["calls"] == codes["rate_limited"]
        assert codes.get("ok", 0) <= KEY_BUDGET_BURST + KEY_BUDGET_PER_S * elapsed + 50  # before: all 6,400
        assert (await ping)["t"] > 0  # the console was answered meanwhile
    finally:
        for _, writer in opened:
            writer.close()
        await console.stop()
    # the uid's slots come back as its connections close
    await wait_for(lambda: agent.principals.holds(uid_principal(os.getuid()), "connection") == 0, timeout=10)


class _Reader:
    def __init__(self, unread: int):
        self.unread, self.dropped = unread, ""

    def unread_bytes(self) -> int:
        return self.unread

    def drop(self, why: str) -> None:
        self.dropped = why


def test_the_tally_counts_each_kind_per_principal_and_gives_slots_back_once():
    tally = Principals(connections=2, channels=3, forwards=1)
    first, second = tally.take("key a", "connection", "a"), tally.take("key a", "connection", "a")
    assert first and second and tally.take("key a", "connection", "a") is None
    assert tally.take("uid 7", "connection", "seven") is not None  # another principal is not affected
    first.release()
    first.release()  # once, however often
    assert tally.holds("key a", "connection") == 1
    assert tally.take("key a", "forward", "a") and tally.take("key a", "forward", "a") is None
    assert tally.refused == {"connection": 1, "forward": 1}


def test_past_its_unread_cap_a_principals_channel_furthest_behind_is_dropped():
    tally = Principals(unread_bytes=1000)
    near, far, other = _Reader(400), _Reader(700), _Reader(900)
    tally.watch("uid 7", near)
    tally.watch("uid 7", far)
    tally.watch("uid 8", other)  # another principal's: counted apart
    tally.check_unread("uid 8", "eight")
    tally.check_unread("uid 7", "seven")
    assert far.dropped and not near.dropped and not other.dropped and tally.refused == {"unread": 1}
