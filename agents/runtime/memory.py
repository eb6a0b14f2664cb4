"""An in-memory transport between a client core's link and an agent's channel, in one event loop: no SSH, no process.

The tests' fast tier runs a real ``Agent`` (its components, its dispatch, its events) and a real client
(``FleetClient``, ``PeerClient``: the same ``LinkCore``, hello check and read loop) with this opener between
them. The bytes are the same JSON lines; what a socket or an SSH channel does to them is kept where the limits
depend on it: the agent's channel sees its write buffer grow while the client does not read (it pauses reading,
and closes a console far behind), the client reads lines in pieces as asyncssh hands them back (``read_line``
joins them, bounded by MAX_REPLY_BYTES), and either side's close is the other's end of stream. What only the SSH
door does (key auth, the per-key tally, channels per connection) is not here: those keep end-to-end tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from agents.runtime.link import Transport
from agents.wire.protocol import LinkStatus

if TYPE_CHECKING:
    from agents.runtime.link import Link
    from agents.wire.lab.machines import Machine

PIECE_BYTES = 64 * 1024  # the longest piece readline() hands back of a longer line (asyncssh hands back pieces too)


class ServerSide(Protocol):
    """The agent's end of one stream, as a transport's protocol drives it (agents/shell/channel.py's Channel is one)."""

    def open(self) -> None: ...
    def feed(self, data: bytes) -> None: ...
    def pause(self) -> None: ...  # the client is not taking what is written: stop reading its requests
    def resume(self) -> None: ...
    def end_of_requests(self) -> None: ...
    def close(self) -> None: ...


class MemoryPipe:
    """One connection: the agent's transport (write, buffer size, pause and resume reading, close) on one side, the
    client's reader and writer on the other."""

    def __init__(self) -> None:
        self.side: ServerSide | None = None
        self._loop = asyncio.get_running_loop()
        self._to_client = bytearray()  # written by the agent, not yet read by the client: its write buffer
        self._to_agent: list[bytes] = []  # written by the client, held while the agent reads nothing
        self._arrived = asyncio.Event()
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._writing_paused = False
        self._reading_paused = False
        self.closed = False

    # -- the agent's transport (agents/shell/channel.py's _Transport)

    def write(self, data: bytes) -> None:
        if self.closed:
            raise BrokenPipeError("the client closed the connection")
        self._to_client += data
        self._arrived.set()
        if not self._writing_paused and len(self._to_client) > self._high and self.side is not None:
            self._writing_paused = True
            self.side.pause()

    def get_write_buffer_size(self) -> int:
        return len(self._to_client)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        if self.closed:
            raise RuntimeError("the connection is closed")
        self._reading_paused = False
        self._loop.call_soon(self._deliver)

    def close(self) -> None:
        """Either side closes: the client reads the end of the stream, the agent's channel is closed (once)."""
        if self.closed:
            return
        self.closed = True
        self._arrived.set()
        self._to_agent.clear()
        if self.side is not None:
            self._loop.call_soon(self.side.close)

    # -- the client's reader and writer (agents/runtime/link.py's LineReader, LineWriter)

    async def readline(self) -> bytes:
        """A line, or a piece of a long one; b"" at the end of the stream."""
        while True:
            newline = self._to_client.find(b"\n", 0, PIECE_BYTES)
            if newline >= 0 or len(self._to_client) >= PIECE_BYTES:
                end = newline + 1 if newline >= 0 else PIECE_BYTES
                piece = bytes(self._to_client[:end])
                del self._to_client[:end]
                if self._writing_paused and len(self._to_client) <= self._low and self.side is not None and not self.closed:
                    self._writing_paused = False
                    self.side.resume()
                return piece
            if self.closed:
                return b""
            self._arrived.clear()
            await self._arrived.wait()

    def send(self, data: bytes, /) -> None:
        """The client's write: delivered on the loop's next turn, as a socket's data_received is."""
        if self.closed:
            raise BrokenPipeError("the connection is closed")
        self._to_agent.append(bytes(data))
        self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        while self._to_agent and not self._reading_paused and not self.closed and self.side is not None:
            self.side.feed(self._to_agent.pop(0))


class _Writer:
    def __init__(self, pipe: MemoryPipe) -> None:
        self.pipe = pipe

    def write(self, data: bytes, /) -> None:
        self.pipe.send(data)


# The agent's end of a new connection to this machine: its channel on the pipe, with the caller's role and budget
# (None: no agent answers there, as a refused connection)
Accept = Callable[["Machine", MemoryPipe], "ServerSide | None"]


class MemoryOpener:
    """A client core's Opener (agents/runtime/link.py) that connects each link to an agent in this process."""

    def __init__(self, accept: Accept) -> None:
        self.accept = accept
        self.pipes: list[MemoryPipe] = []  # every connection opened, newest last (a test may close one: a dropped link)

    async def open(self, link: Link) -> Transport:
        pipe = MemoryPipe()
        side = self.accept(link.machine, pipe)
        if side is None:
            raise ConnectionRefusedError(f"no agent answers for {link.name}")
        pipe.side = side
        side.open()
        self.pipes.append(pipe)

        async def close() -> None:
            pipe.close()

        return Transport(reader=pipe, writer=_Writer(pipe), close=close)

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        return None  # the core's words: a refused connection reads as the agent not running, as it does over SSH
