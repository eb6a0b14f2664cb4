"""The wire under abuse: unencodable answers, deep JSON, huge replies, channel and topic caps, a wrong machine at the door."""

from __future__ import annotations

import json
import sys

import asyncssh
import pytest
import yaml

from agents.runtime.limits import MAX_CHANNELS_PER_CONNECTION
from agents.runtime.link import read_line
from agents.shell.demo.lab import DemoLab
from agents.wire.lab.model import load_lab
from agents.wire.protocol import MAX_REPLY_BYTES, ErrorCode, RemoteError
from console.lab.client import FleetClient
from tests.support.agent_process import connected, next_reply, raw_channel
from tests.support.waits import wait_for

PY = sys.executable


# 10,000 lines of 300 characters (3 MB: more than the 2 MiB SSH window) ...
WIDE_LOG = "for i in range(10000):\n    print(f'{i:05d} ' + 'x' * 294)\n"


# ... and 10,000 lines of 300 control characters, 18 MB as JSON: more than a reply may be
ESCAPED_LOG = "for i in range(10000):\n    print(f'{i:05d} ' + chr(1) * 294)\n"


@pytest.fixture
def chatty_demo(tmp_path, lab_file):
    data = {
        "lab": "wire",
        "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
        "trainers": [
            {"name": "wide", "machine": "box", "command": [PY, "-c", WIDE_LOG], "output_dir": "runs/{job_id}"},
            {"name": "escaped", "machine": "box", "command": [PY, "-c", ESCAPED_LOG], "output_dir": "runs/{job_id}"},
        ],
    }
    with DemoLab(tmp_path / "run", source=lab_file(data)) as demo:
        yield demo


async def test_an_answer_that_cannot_be_encoded_is_internal_and_the_stream_goes_on(small_demo):
    ticks: list[dict] = []
    client = await connected(small_demo.lab_path, on_event=lambda m, e, d: ticks.append(d) if e == "tick" else None)
    conn, writer, reader = await raw_channel(small_demo)
    try:
        # JSON has no Infinity, but Python's parser takes it: the answer (and the next ticks) would hold it
        writer.write(b'{"id": 1, "method": "sim.override", "params": {"gpu": 0, "power_w": Infinity}}\n')
        reply = await next_reply(reader)
        assert reply["id"] == 1 and ("result" in reply or reply["error"]["code"] in ("internal", "invalid_params")), reply
        writer.write(b'{"id": 2, "method": "ping"}\n')
        assert "t" in (await next_reply(reader))["result"]
        seen = len(ticks)
        await wait_for(lambda: len(ticks) >= seen + 3, timeout=15)  # the ticks go on, the number as null
        assert all(g.power_w is None or g.power_w < 1e6 for g in client.state.machines["box"].gpus.values())
        try:  # answered either way: whole once the number is nulled where it enters, else `internal`, never silence
            assert (await client.call("box", "status"))["gpus"]
        except RemoteError as exc:
            assert exc.code == ErrorCode.INTERNAL, exc
    finally:
        writer.write(b'{"id": 3, "method": "sim.override", "params": {"gpu": 0, "clear": true}}\n')
        conn.close()
        await client.stop()


async def test_json_nested_past_the_parser_is_invalid_request_also_when_rate_limited(small_demo):
    conn, writer, reader = await raw_channel(small_demo)
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    try:
        writer.write(deep)
        reply = await next_reply(reader)
        assert reply["error"]["code"] == ErrorCode.INVALID_REQUEST and "deep" in reply["error"]["message"]
        # spend the whole budget at once, then the deep line again: answered, and the connection lives
        writer.write(b'{"id": 0, "method": "ping"}\n' * 600 + deep)
        replies = [await next_reply(reader) for _ in range(601)]
        codes = [r.get("error", {}).get("code") for r in replies]
        # the deep line, sent past the budget, is refused before it is parsed (long lines spend the budget first):
        # a typed answer either way, never a traceback or a dropped connection
        assert ErrorCode.RATE_LIMITED in codes and codes[-1] in (ErrorCode.RATE_LIMITED, ErrorCode.INVALID_REQUEST)
        answered = []

        async def pinged() -> bool:
            writer.write(b'{"id": 9, "method": "ping"}\n')
            answered.append(await next_reply(reader))
            return "result" in answered[-1]

        await wait_for(pinged, timeout=10, interval=0.1)  # the budget refills: a ping goes through again on the same connection
    finally:
        conn.close()


async def test_replies_larger_than_the_ssh_window_arrive_whole_and_none_is_larger_than_the_limit(chatty_demo, use_openssh):
    client = await connected(chatty_demo.lab_path, subscribe=[], reconnect=False, use_openssh=use_openssh)
    assert client.transports["box"] == ("openssh" if use_openssh else "asyncssh")
    try:
        wide = await client.call("box", "jobs.start", {"recipe": "wide"})
        escaped = await client.call("box", "jobs.start", {"recipe": "escaped"})

        async def ended(job_id: str) -> bool:
            return (await client.call("box", "jobs.get", {"id": job_id}))["state"] not in ("starting", "running")

        async def both_ended() -> bool:
            return all([await ended(job["id"]) for job in (wide, escaped)])

        await wait_for(both_ended, timeout=40, interval=0.1)
        logs = await client.call("box", "jobs.logs", {"id": wide["id"], "tail_lines": 10000}, timeout=30)
        assert len(logs["lines"]) == 10000 and logs["lines"][-1].startswith("09999 ") and not logs.get("truncated")
        assert len(json.dumps(logs)) > 2 * 1024 * 1024  # more than one SSH window: read whole, not in pieces
        cut = await client.call("box", "jobs.logs", {"id": escaped["id"], "tail_lines": 10000}, timeout=30)
        assert cut["truncated"] is True and cut["omitted"] > 0 and len(cut["lines"]) + cut["omitted"] == 10000
        assert cut["lines"][-1].startswith("09999 ")  # a log keeps its newest lines
        assert len(json.dumps(cut, separators=(",", ":"))) < MAX_REPLY_BYTES
        assert "t" in await client.call("box", "ping")
    finally:
        await client.stop()


async def test_a_line_longer_than_the_limit_is_dropped_whole_and_the_next_one_read(small_demo):
    class Pieces:
        """A reader handing out lines in pieces, as asyncssh does past its window."""

        def __init__(self, chunks: list[bytes]):
            self.chunks = chunks

        async def readline(self) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    huge = [b"x" * MAX_REPLY_BYTES, b"y" * 10 + b"\n"]
    reader = Pieces([b'{"a":', b" 1}\n", *huge, b'{"b": 2}\n'])
    assert await read_line(reader) == b'{"a": 1}\n'
    assert await read_line(reader) == b""  # too long: dropped, read to its end
    assert await read_line(reader) == b'{"b": 2}\n'
    assert await read_line(reader) is None


async def test_channels_per_connection_and_subscribe_topics_are_capped(small_demo):
    conn, writer, reader = await raw_channel(small_demo)
    try:
        for _ in range(MAX_CHANNELS_PER_CONNECTION - 1):
            await conn.open_session(subsystem="cetlab", encoding=None)
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.open_session(subsystem="cetlab", encoding=None)
        writer.write(
            json.dumps({"id": 1, "method": "subscribe", "params": {"topics": [f"t{i}" for i in range(80_000)]}}).encode() + b"\n"
        )
        assert (await next_reply(reader, timeout=20))["error"]["code"] == ErrorCode.INVALID_PARAMS
        writer.write(b'{"id": 2, "method": "subscribe", "params": {"topics": ["tick", "no-such-topic"]}}\n')
        reply = await next_reply(reader)
        assert reply["error"]["code"] == ErrorCode.INVALID_PARAMS and "no-such-topic" in reply["error"]["message"]
        writer.write(b'{"id": 3, "method": "subscribe", "params": {"topics": ["tick", "notice"]}}\n')
        assert (await next_reply(reader))["result"]["topics"] == ["notice", "tick"]
    finally:
        conn.close()


async def test_the_console_refuses_an_agent_that_answers_as_another_machine(small_demo, tmp_path):
    data = yaml.safe_load(small_demo.lab_path.read_text())
    data["machines"][0]["name"] = "elsewhere"  # the lab says this address is another machine
    for key in ("key", "known_hosts"):
        data["console"][key] = str(small_demo.dir / data["console"][key])
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(data))
    client = FleetClient(load_lab(wrong), reconnect=False)
    await client.start()
    try:
        await client.wait_connected(20)
        view = client.state.machines["elsewhere"]
        assert not view.online and "answers as machine 'box'" in (view.error or ""), (view.link, view.error)
        with pytest.raises(RemoteError):
            await client.call("elsewhere", "ping")
    finally:
        await client.stop()
