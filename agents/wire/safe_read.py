"""Reading a file that someone else controls (a trainer, an engine, a watched folder): never a link, never a pipe, never unbounded.

The rule for every file the agent reads from outside itself: open it with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink
to /dev/zero is refused, a FIFO neither blocks the open nor the read), check on the open descriptor that it is a
regular file (what the name pointed to a moment ago does not count), and read at most a cap, from that same
descriptor. Callers that run on the event loop use :func:`read_capped_async`, which reads in a thread with a
timeout (a regular file on a hung network mount still must not freeze the ticks).
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path

ADAPTER_CONFIG_MAX_BYTES = 1024 * 1024  # a PEFT adapter_config.json is a few KB
READ_TIMEOUT_S = 5.0  # one file, off the loop; past it the reader gives up (the thread ends when the kernel lets it)
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotARegularFile(OSError):
    """The path is a symlink, a FIFO, a device, a socket or a folder: the agent reads none of them."""


class TooLarge(OSError):
    """The file is larger than the reader's cap."""


def open_regular(path: Path | str) -> int:
    """A read-only descriptor on a regular file at `path` that is not a symlink; NotARegularFile otherwise.

    The caller closes it. FileNotFoundError and other OSErrors pass through."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise NotARegularFile(errno.ELOOP, "a symlink (not followed)", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(errno.EINVAL, f"not a regular file ({_kind(mode)})", str(path))
        os.set_blocking(fd, True)  # a regular file: reads never wait on a writer
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def read_capped(path: Path | str, max_bytes: int) -> bytes:
    """The whole content of the regular file at `path`, at most `max_bytes`; TooLarge past it (read from the descriptor,
    so a file that grows while it is read is refused too)."""
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > max_bytes:
        raise TooLarge(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
    return b"".join(chunks)


def read_tail(path: Path | str, max_bytes: int) -> tuple[bytes, int, int]:
    """(the last `max_bytes` of the regular file at `path`, where they start, the file's size)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        return os.pread(fd, max_bytes, start), start, size
    finally:
        os.close(fd)


def read_range(path: Path | str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """(at most `max_bytes` from `offset` of the regular file at `path`, its size)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, max_bytes, offset), size
    finally:
        os.close(fd)


async def read_capped_async(path: Path | str, max_bytes: int, timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """:func:`read_capped` in a thread, with a timeout (TimeoutError)."""
    async with asyncio.timeout(timeout_s):  # not wait_for: see agents/runtime/waits.py within()
        return await asyncio.to_thread(read_capped, path, max_bytes)
