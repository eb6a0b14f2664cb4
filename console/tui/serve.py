"""`cetlab-console --serve`: the same console in a browser, for a wall screen (textual-serve).

textual-serve runs one console process per browser connection (a websocket carrying the terminal), so each open tab
costs a console and its SSH connections to every agent: the number of sessions is capped. The page has no login, so
it listens on 127.0.0.1 unless told otherwise twice (a non-loopback --host and --open-to-network), and the served
console is read-only unless --operator is given.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from textual_serve.server import Server

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
DEFAULT_MAX_SESSIONS = 4  # each one a console process with its own connections to every agent


class ServeError(ValueError):
    """A --serve option that cannot be honoured, said as the command line should read it."""


def is_loopback(host: str) -> bool:
    """True for an address (or `localhost`) only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_host(host: str, open_to_network: bool) -> str | None:
    """None when `host` may be served on; else why not. A warning for a permitted non-loopback host is `network_warning`."""
    if is_loopback(host) or open_to_network:
        return None
    return (
        f"--host {host} would serve the console to the network, and the page has no login: "
        "add --open-to-network to mean it (and keep it read-only, without --operator)"
    )


def network_warning(host: str, operator: bool) -> str:
    acting = "and ACT on the lab (--operator)" if operator else "(read-only)"
    return f"WARNING: the console is served on {host} with no login: anyone who reaches this port can watch the lab {acting}"


def public_url(host: str, port: int) -> str:
    """The URL a browser uses: the page's websocket address is built from it, so a wildcard host names this machine."""
    shown = socket.getfqdn() if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:  # an IPv6 literal
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def console_command(lab_path: Path, *, operator: bool, trust_new_hosts: bool) -> str:
    """The shell command textual-serve starts per browser session: this console on `lab_path`, read-only unless `operator`."""
    argv = [sys.executable, "-m", "console.tui.app", "--lab", str(lab_path.resolve())]
    if not operator:
        argv.append("--readonly")
    if trust_new_hosts:
        argv.append("--trust-new-hosts")
    return shlex.join(argv)


class ConsoleServer(Server):
    """textual-serve's server with a cap on live sessions and the console's own start lines."""

    def __init__(self, command: str, *, host: str, port: int, max_sessions: int, operator: bool, lab_name: str) -> None:
        super().__init__(command, host=host, port=port, title=f"cetlab · {lab_name}", public_url=public_url(host, port))
        self.max_sessions = max_sessions
        self.operator = operator
        self.sessions = 0

    async def on_startup(self, app: web.Application) -> None:
        mode = "OPERATOR: browsers can act on the lab" if self.operator else "read-only"
        print(f"cetlab console served at {self.public_url}  ({mode}; at most {self.max_sessions} browser sessions)", flush=True)
        print("press Ctrl+C to stop", flush=True)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        # counted before the upgrade: a refused tab costs no process
        if self.sessions >= self.max_sessions:
            raise web.HTTPServiceUnavailable(
                text=f"cetlab: {self.sessions} console sessions are open, the most this server allows (--max-sessions)\n",
            )
        self.sessions += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions -= 1


def serve(
    lab_path: Path,
    lab_name: str,
    *,
    host: str,
    port: int,
    operator: bool,
    open_to_network: bool,
    max_sessions: int,
    trust_new_hosts: bool,
) -> None:
    """Serve the console until interrupted (ServeError before listening when an option cannot be honoured)."""
    if why := check_host(host, open_to_network):
        raise ServeError(why)
    if max_sessions < 1:
        raise ServeError(f"--max-sessions {max_sessions}: at least 1")
    if not is_loopback(host):
        print(network_warning(host, operator), file=sys.stderr, flush=True)
    command = console_command(lab_path, operator=operator, trust_new_hosts=trust_new_hosts)
    server = ConsoleServer(command, host=host, port=port, max_sessions=max_sessions, operator=operator, lab_name=lab_name)
    server.serve()


def serve_options(parser: Any) -> None:
    """The --serve group of `cetlab-console`'s options."""
    group = parser.add_argument_group("serving to a browser (a wall screen)")
    group.add_argument("--serve", action="store_true", help="serve the console to browsers instead of this terminal")
    group.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    group.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    group.add_argument("--operator", action="store_true", help="let browsers act on the lab (default: read-only)")
    group.add_argument("--open-to-network", action="store_true", help="allow a non-loopback --host (the page has no login)")
    group.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"browser tabs served at once, each a console process (default {DEFAULT_MAX_SESSIONS})",
    )
