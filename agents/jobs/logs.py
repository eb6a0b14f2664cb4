"""Job logs: the tail across rotated files, reads from an offset, and followers that survive rotation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from agents.wire.safe_read import read_range, read_tail

MAX_READ_BYTES = 256 * 1024  # per call or push; a follower catches up over the next ticks
TAIL_MAX_BYTES = 8 * 1024 * 1024  # the most a tail reads of one file (a reply is cut at 8 MiB anyway)


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


class Tail(NamedTuple):
    lines: list[str]
    size: int  # the current file's size: where a follower continues
    cut: bool  # fewer lines than asked although older ones exist: the read stopped at TAIL_MAX_BYTES


def tail(path: Path, lines: int) -> Tail:
    """The last `lines` lines (from the current file, then the rotated `.1`) and the current file's size. Long lines
    widen the read (x4 at a time, up to TAIL_MAX_BYTES), so as many lines come back as were asked and exist; past that
    the tail is cut (and says so), never joined to the rotated file over the lines it skipped."""
    out: list[str] = []
    size = 0
    for i, candidate in enumerate((path, path.with_name(path.name + ".1"))):
        window = max(4096, lines * 512)
        while True:
            try:
                chunk, start, end = read_tail(candidate, window)
            except OSError:  # missing, or not a regular file (never followed or waited on)
                chunk, start, end = b"", 0, 0
                break
            found = _lines(chunk)
            if start > 0 and found:
                found = found[1:]  # the first one is cut
            if len(found) + len(out) >= lines or start == 0 or window >= TAIL_MAX_BYTES:
                break
            window = min(TAIL_MAX_BYTES, window * 4)
        if i == 0:
            size = end
        out = found + out if chunk else out
        if len(out) >= lines:
            break
        if chunk and start > 0:  # stopped at TAIL_MAX_BYTES with older lines before it
            return Tail(out, size, True)
    return Tail(out[-lines:] if lines else [], size, False)


def read_from(path: Path, offset: int, final: bool = False) -> tuple[list[str], int]:
    """Complete lines from `offset` on (from 0 when the file was rotated under it) and the next offset;
    `final`: the file will not grow, so a last line without a newline counts too."""
    try:
        data, size = read_range(path, offset, MAX_READ_BYTES)
        if offset > size:
            offset = 0
            data, size = read_range(path, offset, MAX_READ_BYTES)
    except OSError:
        return [], offset
    end = len(data) - 1 if final else data.rfind(b"\n")
    if end < 0:
        return [], offset
    return _lines(data[: end + 1]), offset + end + 1


@dataclass
class Follower:
    """One console following one job's log from a known offset, across rotations (by inode)."""

    path: Path
    offset: int
    inode: int | None = None

    def __post_init__(self) -> None:
        self.inode = _inode(self.path)

    def read(self) -> tuple[list[str], int]:
        """New complete lines since the last read, and the offset in the current file."""
        lines: list[str] = []
        current = _inode(self.path)
        if current != self.inode and self.inode is not None:
            rotated = self.path.with_name(self.path.name + ".1")
            if _inode(rotated) == self.inode:  # finish the file we were reading, now renamed
                lines, _ = read_from(rotated, self.offset, final=True)
            self.offset, self.inode = 0, current
        elif self.inode is None:
            self.inode = current
        more, self.offset = read_from(self.path, self.offset)
        return lines + more, self.offset


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None
