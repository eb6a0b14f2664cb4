"""Fuzz the wire: malformed, oversized, wrong-typed and out-of-order messages over one real SSH channel."""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.runtime.limits import BYTES_PER_COST, request_cost
from agents.runtime.rpc import parse_request
from agents.runtime.waits import within
from agents.shell.server import RATE_BURST, RATE_PER_S, TokenBucket
from agents.wire.protocol import MAX_MESSAGE_BYTES, ErrorCode, RemoteError
from tests.support.agent_process import connected, raw_channel

# The client paces itself with the agent's own token bucket at 90% of its rate and half its burst, so every
# message reaches the dispatcher however the machine stalls: a stall refills the client's bucket no further than
# half the agent's, and the client sends a batch only after the previous one was answered.
CLIENT_RATE_PER_S, CLIENT_BURST = RATE_PER_S * 0.9, RATE_BURST // 2


CODES = {c.value for c in ErrorCode} - {ErrorCode.INTERNAL.value}


PARAM_KEYS = [
    "interval_s",
    "since",
    "max_points",
    "topics",
    "recipe",
    "params",
    "id",
    "tail_lines",
    "offset",
    "follow",
    "grace_s",
    "limit",
    "model",
    "pinned",
    "out",
    "in",
    "name",
    "path",
    "by",
    "who",
    "method",
    "before_id",
    "step",
]


scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40)


values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12
)


class Wire:
    """A raw channel driven from a background event loop, so hypothesis (sync) can talk to the real agent."""

    def __init__(self, demo):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conn, self.writer, self.reader = self.run(raw_channel(demo))
        self.sent = 0
        self.bucket = TokenBucket(CLIENT_RATE_PER_S, CLIENT_BURST)
        self.codes: dict[str, int] = {}

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _pace(self, data: bytes) -> None:
        """Take from the client's bucket what each line costs the agent (its length, then its method), waiting
        for the refill: with the same costs, a slower rate and half the burst, the agent's budget never runs out."""
        for line in data.split(b"\n"):
            if not line.strip() or len(line) > MAX_MESSAGE_BYTES:
                continue  # blank lines are skipped and oversized ones refused before the budget
            self.sent += 1
            size_cost = len(line) / BYTES_PER_COST
            cost = size_cost if size_cost > 1 else 0.0
            try:
                request = parse_request(line)
                cost += request_cost(request.get("method"), request.get("params"))
            except RemoteError:
                pass  # answered by the parser, free of budget
            while not self.bucket.take(cost):
                time.sleep(1 / CLIENT_RATE_PER_S)  # the point: a client that keeps within its budget's rate

    async def _exchange(self, data: bytes, sentinel: str, count: int) -> list[bytes]:
        # requests run concurrently, so replies come in any order: wait for the sentinel ping and `count` others
        self.writer.write(data + json.dumps({"id": sentinel, "method": "ping"}).encode() + b"\n")
        lines, seen_sentinel = [], False
        while not seen_sentinel or len(lines) < count:
            line = await within(self.reader.readline(), 30)
            assert line, "the agent closed the channel"
            message = json.loads(line)
            if "event" in message:
                continue
            if message.get("id") == sentinel:
                assert "result" in message, message
                seen_sentinel = True
            else:
                lines.append(line)
        return lines

    def replies(self, data: bytes, count: int) -> list[dict]:
        """Send raw bytes and a ping; `count` replies besides the ping's, parsed and checked."""
        self._pace(data + b"\n" + json.dumps({"id": "sentinel", "method": "ping"}).encode())  # the sentinel's too
        sentinel = f"sentinel-{self.sent}"
        lines = self.run(self._exchange(data, sentinel, count))
        replies = []
        for line in lines:
            assert b"Traceback" not in line and b'File "' not in line, line[:300]
            reply = json.loads(line)
            if "error" in reply:
                code = reply["error"]["code"]
                assert code in CODES, reply  # typed, and never an internal error
                assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
                self.codes[code] = self.codes.get(code, 0) + 1
            else:
                assert "result" in reply, reply
                self.codes["ok"] = self.codes.get("ok", 0) + 1
            replies.append(reply)
        return replies

    def close(self) -> None:
        self.conn.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def wire(small_demo):
    w = Wire(small_demo)
    yield w
    w.close()


@pytest.mark.timeout(240)
def test_fuzz_the_protocol_over_one_channel_while_another_client_pings(small_demo, wire):
    methods = [m["name"] for m in wire.run(_methods(small_demo))]
    known = st.sampled_from(methods)
    odd = {
        "id": st.none()
        | st.integers(-(2**40), 2**40)
        | st.text(max_size=12)
        | st.booleans()
        | st.floats()
        | st.lists(scalars, max_size=2),
        "event": st.sampled_from(["tick", "log", "notice"]),  # a console sending what only agents send
        "result": values,
    }
    # mostly real methods with wrong-typed params (deep into validation), some with anything at all
    requests = st.fixed_dictionaries(
        {"method": known, "params": st.dictionaries(st.sampled_from(PARAM_KEYS), values, max_size=4)}, optional=odd
    ) | st.fixed_dictionaries({}, optional={**odd, "method": known | st.text(max_size=30) | values, "params": values})
    cases = {"structured": 0, "bytes": 0, "oversized": 0}
    stop = threading.Event()
    pings = {"ok": 0, "failed": 0}
    pinger = threading.Thread(target=lambda: asyncio.run(_ping_throughout(small_demo, stop, pings)), daemon=True)
    pinger.start()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(requests, min_size=1, max_size=8))
    def structured(batch):
        data = b"".join(json.dumps(r).encode() + b"\n" for r in batch)  # NaN and Infinity too: Python's json reads them
        replies = wire.replies(data, len(batch))
        got = [r["id"] for r in replies]
        for request in batch:
            rid = request.get("id")
            if isinstance(rid, (int, str)) and not isinstance(rid, bool):
                got.remove(rid)  # answered under its own id
        cases["structured"] += len(batch)

    structured()

    rng = random.Random(7)
    for _ in range(1500):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
        segments = junk.split(b"\n")
        expected = sum(1 for s in segments[:-1] if s.strip()) + (1 if segments[-1].strip() else 0)
        # the last segment has no newline yet: the sentinel's line completes it
        replies = wire.replies(junk if junk.endswith(b"\n") else junk + b"\n", expected)
        assert all("error" in r for r in replies)
        cases["bytes"] += 1

    big = b'{"id": 1, "method": "ping", "params": {"pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}}'
    for data in (
        big + b"\n",
        b" " * (MAX_MESSAGE_BYTES + 1) + b"\n",
        os.urandom(MAX_MESSAGE_BYTES * 2).replace(b"\n", b"x") + b"\n",
    ):
        replies = wire.replies(data, 1)
        assert [r["error"]["code"] for r in replies] == [ErrorCode.TOO_LARGE]
        cases["oversized"] += 1

    assert wire.replies(b"", 0) == []  # and nothing else was answered: no reply went missing or came twice
    stop.set()
    pinger.join(30)
    total = sum(cases.values())
    print(
        f"\nfuzz: {total} cases ({cases}) on one channel; replies by code {dict(sorted(wire.codes.items()))}; "
        f"second client: {pings['ok']} pings answered, {pings['failed']} failed"
    )
    assert pings["failed"] == 0 and pings["ok"] >= 10
    assert total >= 2000


async def _methods(demo):
    client = await connected(demo.lab_path)
    try:
        return await client.call("box", "methods")
    finally:
        await client.stop()


async def _ping_throughout(demo, stop: threading.Event, pings: dict) -> None:
    client = await connected(demo.lab_path)
    try:
        while not stop.is_set():
            try:
                await client.call("box", "ping", timeout=10)
                pings["ok"] += 1
            except Exception:
                pings["failed"] += 1
            await asyncio.sleep(0.1)  # the point: a console's pace of pings all through the fuzzing, not a wait
    finally:
        await client.stop()


@pytest.mark.timeout(60)
async def test_channels_cut_mid_message_leave_the_agent_serving(small_demo):
    client = await connected(small_demo.lab_path)
    try:
        for cut in (b'{"id": 1, "meth', b"\xff" * 5000, b'{"id": 2, "method": "ping"}\n{"id": 3', b" " * (MAX_MESSAGE_BYTES + 5)):
            conn, writer, _reader = await raw_channel(small_demo)
            writer.write(cut)
            await writer.drain()  # the partial message has left this side before the channel is cut
            conn.abort()
        for _ in range(3):
            conn, writer, _reader = await raw_channel(small_demo)
            writer.write(b'{"id": 1, "method": "history", "params": {"max_points": 3600}}\n')
            conn.close()  # gone before the answer is written
        assert (await client.call("box", "ping"))["t"] > 0
        assert client.state.machines["box"].online
    finally:
        await client.stop()
