"""Per key, not only per connection (issue 21, N6 and N12): one key's connections are capped and share one budget,
and the audit trail tells two keys with the same comment apart. Real agents, real SSH on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import asyncssh
import pytest

from agents.runtime.limits import KEY_BUDGET_BURST, KEY_BUDGET_PER_S, MAX_CONNECTIONS_PER_KEY
from agents.runtime.waits import within
from tests.support.agent_process import connected, raw_channel
from tests.support.ssh_keys import add_key
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(180)


async def test_one_key_gets_at_most_its_cap_of_connections_and_a_console_keeps_going(small_demo, tmp_path):
    viewer = add_key(small_demo, "viewer", tmp_path, "many-viewer")
    console = await connected(small_demo.lab_path)
    held, refused = [], 0
    try:
        for _ in range(MAX_CONNECTIONS_PER_KEY + 8):
            try:
                conn, writer, reader = await raw_channel(small_demo, key=str(viewer))
                writer.write(b'{"id": 1, "method": "ping"}\n')
                line = await within(reader.readline(), 10)
                assert line and "result" in json.loads(line)
                held.append(conn)
            except (asyncssh.PermissionDenied, asyncssh.ChannelOpenError, asyncssh.ConnectionLost, ConnectionError):
                refused += 1
        print(f"\n{len(held)} connections of one key logged in, {refused} refused")
        assert len(held) == MAX_CONNECTIONS_PER_KEY and refused == 8  # before: every one of them
        assert await console.call("box", "ping") is not None  # another key is not affected
    finally:
        for conn in held:
            conn.close()

    # the key's slots are free again once its connections close
    async def again() -> bool:
        try:
            conn, _, _ = await raw_channel(small_demo, key=str(viewer))
        except asyncssh.PermissionDenied:
            return False
        conn.close()
        return True

    await wait_for(again, timeout=20, interval=0.1)  # else the key stayed locked out after its connections closed
    await console.stop()


async def test_a_keys_connections_share_one_budget(small_demo, tmp_path):
    viewer = add_key(small_demo, "viewer", tmp_path, "budget-viewer")
    channels = [await raw_channel(small_demo, key=str(viewer)) for _ in range(20)]
    burst = b'{"id": 1, "method": "ping"}\n' * 400  # each connection's own burst
    codes: dict[str, int] = {}
    try:
        started = time.monotonic()
        for _, writer, _ in channels:
            writer.write(burst)

        async def read(reader) -> None:
            for _ in range(400):
                line = await within(reader.readline(), 30)
                code = json.loads(line).get("error", {}).get("code", "ok")
                codes[code] = codes.get(code, 0) + 1

        await asyncio.gather(*(read(reader) for _, _, reader in channels))
        elapsed = time.monotonic() - started
    finally:
        for conn, _, _ in channels:
            conn.close()
    print(f"\n20 connections x 400 pings of one key in {elapsed:.1f} s: {codes}")
    assert codes.get("ok", 0) <= KEY_BUDGET_BURST + KEY_BUDGET_PER_S * elapsed + 50  # before: all 8,000
    assert codes.get("rate_limited", 0) > 0


async def test_the_audit_trail_tells_two_keys_with_one_comment_apart(small_demo, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = add_key(small_demo, "operator", tmp_path / "a", "twin")
    second = add_key(small_demo, "operator", tmp_path / "b", "twin")
    fingerprints = []
    for path in (first, second):
        client = await connected(small_demo.lab_path, key_path=path)
        try:
            await client.call("box", "set_interval", {"interval_s": 1.0})
        finally:
            await client.stop()
        fingerprints.append(asyncssh.read_private_key(str(path)).get_fingerprint())
    operator = await connected(small_demo.lab_path)
    try:
        trail = await operator.call("box", "audit.list", {"who": "twin", "limit": 10})
        assert sorted(e["key"] for e in trail["entries"]) == sorted(fingerprints)  # before: one `who`, no key
        one = await operator.call("box", "audit.list", {"key": fingerprints[0], "limit": 10})
        assert [e["key"] for e in one["entries"]] == [fingerprints[0]]
    finally:
        await operator.stop()
