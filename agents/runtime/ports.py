"""Ports for servers the agent starts (a model engine, torchrun's rendezvous store), chosen where outgoing connections do not land.

Binding port 0 hands out a port from the kernel's ephemeral range, the same range every outgoing
connection (SSH links, HTTP clients, a trainer's downloads) takes its local port from; a port found
that way and handed to a server that binds it seconds later is often taken by then (EADDRINUSE).
Ports below the ephemeral range are only ever taken by a server that asks for them by number.

Between choosing a port and binding it, another process of this user may choose the same one (two demo labs started
at once, a suite on two workers: a test's gateway lost its port and the client's request met another lab's gateway).
Every port chosen here is claimed first in a folder of this user's claims, so no two choosers hand out the same port
within CLAIM_S of each other.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default low end; IANA's (macOS, Windows) is 49152
LOWEST = 20000  # above the well-known and most registered server ports
TRIES = 200
CLAIM_S = 600.0  # a claim older than this is stale: whoever chose the port has bound it by then, or given it up


def claims_dir() -> Path:
    """This user's port claims: one empty file per port chosen, named by the port (made 0700)."""
    folder = Path(tempfile.gettempdir()) / f"cetlab-ports-{os.geteuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def claim(port: int, folder: Path | None = None, now: float | None = None) -> bool:
    """Claim ``port`` for this process: False when another chooser claimed it less than CLAIM_S ago."""
    path = (folder or claims_dir()) / str(port)
    moment = time.time() if now is None else now
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            if moment - path.stat().st_mtime < CLAIM_S:
                return False
            os.utime(path, (moment, moment))  # stale: taken over (two takers at once both win: as rare as before)
        except OSError:
            return False
        return True
    except OSError:
        return True  # no folder to claim in (a full or read-only temp dir): choose as before, unclaimed
    os.close(fd)
    if now is not None:
        os.utime(path, (moment, moment))
    return True


def ephemeral_low(path: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The lowest port the kernel hands out for outgoing connections and port 0."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def is_free(port: int, host: str = "") -> bool:
    """Whether a server could bind ``port`` on ``host`` now (nobody listens or holds it)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def server_port(host: str = "", avoid: frozenset[int] = frozenset()) -> int:
    """A free port below the ephemeral range (random, so two agents on one box rarely meet), else one from the kernel.

    Args:
        host: the address the server will bind ("" for all of them).
        avoid: ports not to pick (one that was just lost to another process).
    """
    high = ephemeral_low() - 1
    if high > LOWEST:
        for _ in range(TRIES):
            port = random.randint(LOWEST, high)
            if port not in avoid and is_free(port, host) and claim(port):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        given: int = sock.getsockname()[1]
        return given
