"""How a simulated engine process lives and dies (SIMULATED): it follows its agent, and fails on purpose when asked.

Shared by the simulated vLLM (agents.orchestra.engines.vllm.twin) and the simulated llama-server (agents.orchestra.engines.llamacpp.twin).
"""

from __future__ import annotations

import os
import socket
import socketserver
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ORPHAN_GRACE_S = 30.0  # how long a server whose agent died waits to be re-adopted


def exit_with_parent(pid: int) -> None:
    """A simulated server never outlives its agent (a real engine may: it keeps serving)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)


def follow_agent(pid_file: Path) -> None:
    """Live while some agent owns the state dir: a restarted agent re-adopts us; none for ORPHAN_GRACE_S: exit."""
    orphan_since = None
    while True:
        time.sleep(1.0)
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            orphan_since = None
        except (OSError, ValueError):
            orphan_since = orphan_since or time.monotonic()
            if time.monotonic() - orphan_since > ORPHAN_GRACE_S:
                os._exit(0)


def fail_later(seconds: float) -> None:
    time.sleep(seconds)
    print(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (SIMULATED failure: fail_after_s)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


class UnixHTTPServer(ThreadingHTTPServer):
    """The stdlib's HTTP server on a unix socket path, as vLLM's --uds and llama-server's --host PATH.sock listen."""

    address_family = socket.AF_UNIX

    def __init__(self, path: str, handler: type[BaseHTTPRequestHandler]):
        # TCP_NODELAY is a TCP option: a handler that sets it would fail every request on a unix socket
        super().__init__(path, type(handler.__name__, (handler,), {"disable_nagle_algorithm": False}))  # type: ignore[arg-type]

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's own reads a host and a port from the address
        self.server_name, self.server_port = "localhost", 0

    def get_request(self) -> tuple[socket.socket, tuple[str, int]]:
        sock, _ = self.socket.accept()
        return sock, ("unix", 0)  # a unix peer has no address; the handler's access line names one


def http_server(
    handler: type[BaseHTTPRequestHandler], host: str, port: int | None, uds: str | None, backlog: int = 5
) -> ThreadingHTTPServer:
    """Listen where the engine is told to: the unix socket ``uds``, or ``host``:``port``; ``backlog``: socketserver's
    default is 5, and a burst of clients past it is refused."""
    server: ThreadingHTTPServer
    if uds is not None:
        Path(uds).unlink(missing_ok=True)  # a killed server's: bind would fail on it
        server = type("SimUnixServer", (UnixHTTPServer,), {"request_queue_size": backlog})(uds, handler)
    elif port is None:
        raise SystemExit("--port is needed without a unix socket")
    else:
        server = type("SimServer", (ThreadingHTTPServer,), {"request_queue_size": backlog})((host, port), handler)
    server.daemon_threads = True
    return server
