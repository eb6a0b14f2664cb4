"""A local notification receiver (the demo's, labelled SIM, and the tests'): records every POST it gets as a JSON line.

    python -m agents.notify.receiver --port 8402 --log DIR/notifications.jsonl [--parent-pid PID]

It stands in for Slack, Discord, ntfy or a JSON webhook: it answers 200 and keeps the request
(path, the headers that matter, the body) so a person or a test can see what arrived.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agents.runtime.keys import open_private_log

MAX_BODY = 1024 * 1024
KEPT_HEADERS = ("content-type", "authorization", "x-title", "x-priority", "x-tags")


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread: `received` lists what came; `stall` holds every answer while set."""

    def __init__(self, port: int = 0, log: Path | None = None, status: int = 200):
        self.port = port
        self.log = log
        self.status = status
        self.received: list[dict[str, Any]] = []
        self.stall = threading.Event()  # set: requests are read, then held unanswered until it is cleared
        self.held = 0  # requests being held now
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                body = self.rfile.read(length)
                entry: dict[str, Any] = {
                    "at": time.time(),
                    "path": self.path,
                    "headers": {k: v for k, v in self.headers.items() if k.lower() in KEPT_HEADERS},
                }
                try:
                    entry["json"] = json.loads(body)
                except ValueError:
                    entry["text"] = body.decode("utf-8", "replace")
                if receiver.stall.is_set():
                    with receiver._lock:
                        receiver.held += 1
                    while receiver.stall.is_set() and receiver._server is not None:
                        time.sleep(0.05)
                    with receiver._lock:
                        receiver.held -= 1
                receiver._record(entry)
                ok = 200 <= receiver.status < 300
                payload = json.dumps(
                    {"ok": True} if ok else {"error": f"no hook at {self.path}"}
                ).encode()  # as many servers do: echo the path
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, name="receiver", daemon=True).start()
        return self

    def _record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.received.append(entry)
            if self.log is not None:
                with open_private_log(self.log) as f:  # each POST's path holds the hook's token
                    f.write((json.dumps(entry) + "\n").encode())

    def stop(self) -> None:
        """Go down (the port refuses connections until start() again)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.notify.receiver", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True, help="where to append what arrives, one JSON line each")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = parser.parse_args(argv)
    receiver = Receiver(args.port, args.log).start()
    try:
        while args.parent_pid is None or _alive(args.parent_pid):
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    receiver.stop()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    raise SystemExit(main())
