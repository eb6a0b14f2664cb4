"""The demo lab's notification receiver (SIM): a local stand-in for a team chat, so an alert is seen arriving."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agents.runtime.demo import NOTIFICATIONS_FILE
from agents.runtime.keys import write_private


def _simulated_hooks(data: dict[str, Any]) -> list[dict[str, Any]]:
    routes = (data.get("notify") or {}).get("routes") or []
    return [r for r in routes if r.get("simulated") and r.get("kind") == "webhook" and r.get("url_file")]


def prepare(directory: Path, data: dict[str, Any], free_ports: Callable[[int], list[int]]) -> None:
    """Each simulated webhook route gets a receiver port and its URL (with a token, as a real hook's) in its mode-600 file."""
    hooks = _simulated_hooks(data)
    received = directory / NOTIFICATIONS_FILE
    if received.exists():  # an older demo's, at 644: its lines hold the hook's token
        received.chmod(0o600)
    for route, port in zip(hooks, free_ports(len(hooks))):
        url = f"http://127.0.0.1:{port}/hooks/demo/{secrets.token_urlsafe(16)}"
        write_private(directory / route["url_file"], (url + "\n").encode())


def receiver_argvs(directory: Path, data: dict[str, Any]) -> list[list[str]]:
    """The receivers to start beside the demo's agents (one per simulated webhook route)."""
    argvs = []
    for route in _simulated_hooks(data):
        url_file = directory / route["url_file"]
        if not url_file.exists():
            continue
        port = urlsplit(url_file.read_text().strip()).port
        argvs.append(
            [sys.executable, "-m", "agents.notify.receiver", "--port", str(port), "--log", str(directory / NOTIFICATIONS_FILE)]
        )
    return argvs
