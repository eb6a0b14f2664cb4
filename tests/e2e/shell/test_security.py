"""Security: roles on every method, the audit trail, rate limits, refused key files and state dirs."""

from __future__ import annotations

import json
import os

import pytest

from agents.runtime.keys import HOST_KEY_NAME, ensure_key
from agents.shell.server import RATE_BURST
from agents.wire.protocol import ErrorCode, RemoteError
from tests.support.agent_process import (
    connected,
    next_reply,
    one_machine_lab,
    raw_channel,
    start_agent,
)
from tests.support.ssh_keys import add_key
from tests.support.waits import wait_for, wait_until


async def test_a_viewer_is_forbidden_every_operator_method_and_the_trail_shows_it(small_demo, tmp_path):
    viewer_key = add_key(small_demo, "viewer", tmp_path, "bob-viewer")
    operator = await connected(small_demo.lab_path)
    viewer = await connected(small_demo.lab_path, key_path=viewer_key)
    try:
        methods = await operator.call("box", "methods")
        guarded = sorted(m["name"] for m in methods if m["role"] == "operator")
        # every subsystem guards its actions: a list that shrank would hide an unguarded verb
        assert {
            "set_interval",
            "jobs.start",
            "jobs.stop",
            "jobs.kill",
            "models.warm",
            "models.cold",
            "models.swap",
            "alerts.ack",
            "audit.list",
        } <= set(guarded), guarded
        for name in guarded:
            with pytest.raises(RemoteError) as info:
                await viewer.call("box", name, {})
            assert info.value.code == ErrorCode.FORBIDDEN, (name, info.value)
            assert "operator" in info.value.message
        viewable = [m["name"] for m in methods if m["role"] == "viewer"]
        assert "status" in viewable and (await viewer.call("box", "status"))["gpus"]
        trail = await operator.call("box", "audit.list", {"who": "bob-viewer", "limit": 1000})
        assert not trail["entries"]  # refusals are counted apart from actions (per key, method and minute)
        denied = {r["method"] for r in trail["refusals"]}
        assert denied == set(guarded) - {"audit.list"}  # reading the trail is not an action
        assert all(r["role"] == "viewer" and r["count"] == 1 for r in trail["refusals"])
    finally:
        await viewer.stop()
        await operator.stop()


async def test_a_burst_beyond_the_rate_limit_is_answered_not_run(small_demo):
    conn, writer, reader = await raw_channel(small_demo)
    other = await connected(small_demo.lab_path)
    try:
        count = RATE_BURST * 5  # sent at once: far more than the burst plus what refills meanwhile
        writer.write(b"".join(json.dumps({"id": i, "method": "ping"}).encode() + b"\n" for i in range(count)))
        replies = [await next_reply(reader) for _ in range(count)]
        assert sorted(r["id"] for r in replies) == list(range(count))  # every request answered, by its id
        limited = [r for r in replies if "error" in r]
        assert limited and all(r["error"]["code"] == ErrorCode.RATE_LIMITED for r in limited)
        assert "slow down" in limited[0]["error"]["message"]
        assert len(replies) - len(limited) >= RATE_BURST
        assert (await other.call("box", "ping"))["t"] > 0  # the limit is per connection

        async def pinged() -> bool:
            writer.write(b'{"id": "after", "method": "ping"}\n')
            return "result" in await next_reply(reader)

        await wait_for(pinged, timeout=10, interval=0.1)  # the bucket refills: the same connection is answered again
    finally:
        conn.close()
        await other.stop()


def _refusal(lab_path, state, timeout: float = 60) -> str:
    proc = start_agent(lab_path, state)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 2, (proc.returncode, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines  # one clear line, no traceback
    return lines[0]


def test_world_readable_host_key_stops_the_agent_with_one_line(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    ensure_key(state / HOST_KEY_NAME)
    (state / HOST_KEY_NAME).chmod(0o644)
    line = _refusal(lab_path, state)
    assert "too open" in line and f"chmod 600 {state / HOST_KEY_NAME}" in line


def test_group_writable_state_dir_stops_the_agent(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o770)
    line = _refusal(lab_path, state)
    assert "writable by others" in line and f"chmod 700 {state}" in line
    assert not (state / "state.db").exists()  # refused before anything was written


def test_second_agent_on_one_state_dir_is_refused(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    state = tmp_path / "state"
    first = start_agent(lab_path, state)
    try:

        def holds_the_lock() -> bool:
            assert first.poll() is None, first.stderr.read()
            return (state / "agent.pid").exists() and (state / "agent.pid").read_text().strip() == str(first.pid)

        wait_until(holds_the_lock, 30)
        line = _refusal(one_machine_lab(tmp_path / "other.yaml"), state)
        assert f"another agent (pid {first.pid})" in line
    finally:
        first.terminate()
        first.wait(timeout=20)
    assert os.stat(state).st_mode & 0o077 == 0


async def test_world_readable_console_key_is_not_used(small_demo, tmp_path):
    key_path = tmp_path / "console_key"
    ensure_key(key_path, comment="careless")
    key_path.chmod(0o644)
    client = await connected(small_demo.lab_path, key_path=key_path, reconnect=False)
    try:
        view = client.state.machines["box"]
        assert view.link == "refused"
        assert "too open" in view.error and f"chmod 600 {key_path}" in view.error
    finally:
        await client.stop()
