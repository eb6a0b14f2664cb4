"""Ports for servers the agent starts (a model engine, torchrun's rendezvous store), chosen where outgoing connections do not land.

Binding port 0 hands out a port from the kernel's ephemeral range, the same range every outgoing
connection (SSH links, HTTP clients, a trainer's downloads) takes its local port from; a port found
that way and handed to a server that binds it seconds later is often taken by then (EADDRINUSE).
Ports below the ephemeral range are only ever taken by a server that asks for them by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default low end; IANA's (macOS, Windows) is 49152
LOWEST = 20000  # above the well-known and most registered server ports
TRIES = 200


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
            if port not in avoid and is_free(port, host):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        given: int = sock.getsockname()[1]
        return given
