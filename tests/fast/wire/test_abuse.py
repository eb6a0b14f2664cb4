"""The wire under abuse: unencodable answers, deep JSON, huge replies, channel and topic caps, a wrong machine at the door."""

from __future__ import annotations

import asyncio

from agents.runtime.link import read_line
from agents.wire.protocol import MAX_REPLY_BYTES
from console.lab.openssh import PipeReader


async def test_the_openssh_pipe_reads_lines_past_its_buffer_and_drops_only_the_over_long_one():
    """ssh's stdout is a pipe with a 64 KiB reader buffer: a longer line comes in pieces, as from asyncssh."""
    stream = asyncio.StreamReader(limit=64 * 1024)
    wide = b'{"lines": "' + b"w" * (3 * 1024 * 1024) + b'"}\n'
    stream.feed_data(b'{"a": 1}\n' + wide + b"x" * (MAX_REPLY_BYTES + 10) + b"\n" + b'{"b": 2}')
    stream.feed_eof()
    reader = PipeReader(stream)
    assert await read_line(reader) == b'{"a": 1}\n'
    assert await read_line(reader) == wide  # 3 MiB, whole
    assert await read_line(reader) == b""  # over the limit: dropped, read to its end
    assert await read_line(reader) is None  # a last line the stream cut before its end is no message


def test_a_size_past_the_params_check_costs_a_ping_not_a_debt_that_outlasts_the_burst():
    from agents.runtime.limits import request_cost

    assert request_cost("history", {"max_points": 3600}) == 101.0
    assert request_cost("history", {"max_points": 10**9}) == 1.0  # refused by the params check anyway
    assert request_cost("jobs.logs", {"tail_lines": 10000}) == 101.0 and request_cost("ping", {}) == 1.0
