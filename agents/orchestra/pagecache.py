"""Model weights in the page cache: measure residency (mincore), pre-read, evict (fadvise)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CHUNK_BYTES = 8 * 1024 * 1024  # per sendfile call: progress granularity, no copy to user space
FALLBACK_BUFFER_BYTES = 1024 * 1024  # where sendfile is refused: small enough to stay in the CPU cache
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def model_files(path: Path) -> list[Path]:
    """Every regular file of a model: the path itself, or all files under it."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Residency:
    resident_bytes: int
    total_bytes: int

    @property
    def fraction(self) -> float:
        return 1.0 if self.total_bytes == 0 else self.resident_bytes / self.total_bytes


def _resident_bytes(fd: int, size: int) -> int:
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    try:
        pages = -(-size // PAGE_BYTES)
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        resident_pages = pages - bytes(vec).count(0)  # the low bit is set for resident pages
    finally:
        _libc.munmap(addr, size)
    return min(size, resident_pages * PAGE_BYTES)


def residency(files: list[Path]) -> Residency:
    """How much of these files is in the page cache right now (mincore on a read-only map)."""
    resident = total = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                total += size
                if size:
                    resident += _resident_bytes(f.fileno(), size)
        except OSError:
            continue  # a file that vanished or cannot be mapped counts as not cached
    return Residency(resident, total)


def _read_chunks(fd: int, sink: int) -> Iterator[int]:
    """Bytes read per step. sendfile to /dev/null: the kernel reads the pages into the cache and
    copies nothing to us, faster than read() into a buffer; plain reads where it is refused."""
    offset = 0
    try:
        while n := os.sendfile(sink, fd, offset, CHUNK_BYTES):
            offset += n
            yield n
        return
    except OSError:
        os.lseek(fd, offset, os.SEEK_SET)
    view = memoryview(bytearray(FALLBACK_BUFFER_BYTES))
    while n := os.readv(fd, [view]):
        yield n


def warm(files: list[Path], on_progress: Callable[[int, int], None] | None = None) -> tuple[int, float]:
    """Read the files into the page cache, in order; returns (bytes read, seconds)."""
    total = sum(p.stat().st_size for p in files)
    done = 0
    started = time.perf_counter()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
                for n in _read_chunks(fd, sink):
                    done += n
                    if on_progress is not None:
                        on_progress(done, total)
            finally:
                os.close(fd)
    finally:
        os.close(sink)
    return done, time.perf_counter() - started


def evict(files: list[Path]) -> None:
    """Drop the files' clean pages from the page cache (dirty pages stay until written back)."""
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_placeholder(path: Path, size_bytes: int) -> None:
    """Placeholder weights for a simulated model (demo): real bytes on disk, then out of the cache."""
    path.mkdir(parents=True, exist_ok=True)
    target = path / "model.safetensors"
    tmp = path / ".model.safetensors.part"
    block = (b"cetlab-sim-weights" * 4096)[: 1024 * 1024]
    with open(tmp, "wb") as f:
        for _ in range(size_bytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())  # clean pages, so the eviction below really drops them
    (path / "config.json").write_text('{"simulated": true}\n')
    os.replace(tmp, target)
    evict([target])


def write_placeholder_file(path: Path, size_bytes: int, magic: bytes = b"GGUF") -> None:
    """One placeholder weights file (a simulated GGUF model): real bytes on disk, then out of the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    block = (b"cetlab-sim-weights" * 4096)[: 1024 * 1024]
    with open(tmp, "wb") as f:
        f.write(magic)
        for _ in range(size_bytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    evict([path])
