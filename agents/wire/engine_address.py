"""Where an engine listens, as one type: every caller (the agent's health checks, sleep and wake, adapter loads, metric
scrapes; the gateway in-process and through another machine's agent) reaches an engine through it.

An engine listens on a unix socket in its agent's private (0700) folder, so no other user of the machine can reach it:
its endpoints (vLLM's /sleep, /wake_up, /collective_rpc, adapter loading; generation itself) have no key. It listens
on 127.0.0.1:PORT only where lab.yaml says so (a model's `port:`) or its server has no unix-socket option
(`transformers serve`); the doctor warns of both. A tick carries the address as its endpoint string:
``unix:/abs/path.sock`` or ``http://127.0.0.1:PORT/v1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

UNIX_PREFIX = "unix:"
MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path, less the terminating NUL
SOCKET_SUFFIX = ".sock"  # llama-server takes a --host ending in .sock as a unix socket path
LOOPBACK = "127.0.0.1"
UNIX_HOST = "localhost"  # the Host header of a request over a unix socket


@dataclass(frozen=True)
class EngineAddress:
    """A unix socket path (absolute, at most 107 bytes, ending in .sock) or a port on 127.0.0.1: exactly one."""

    socket: str | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        if (self.socket is None) == (self.port is None):
            raise ValueError("an engine address is a unix socket path or a 127.0.0.1 port, exactly one")
        if self.socket is not None:
            problem = socket_path_problem(self.socket)
            if problem is not None:
                raise ValueError(problem)
        if self.port is not None and (isinstance(self.port, bool) or not 1 <= self.port <= 65535):
            raise ValueError(f"engine port {self.port!r} is not a port (1-65535)")

    @classmethod
    def parse(cls, text: str) -> EngineAddress:
        """From an endpoint string (``unix:/path.sock`` or ``http://127.0.0.1:PORT[/v1]``); ValueError naming it."""
        if text.startswith(UNIX_PREFIX):
            return cls(socket=text[len(UNIX_PREFIX) :])
        try:
            url = urlsplit(text)
            port = url.port
        except ValueError:
            raise ValueError(f"engine endpoint {text[:200]!r} is not unix:PATH nor http://127.0.0.1:PORT") from None
        if url.scheme != "http" or url.hostname != LOOPBACK or port is None or url.path not in ("", "/", "/v1"):
            raise ValueError(f"engine endpoint {text[:200]!r} is not unix:PATH nor http://127.0.0.1:PORT/v1")
        return cls(port=port)

    @property
    def endpoint(self) -> str:
        """As a tick carries it (and `cetlab models` shows it)."""
        return f"{UNIX_PREFIX}{self.socket}" if self.socket is not None else f"http://{LOOPBACK}:{self.port}/v1"

    @property
    def origin(self) -> str:
        """The URL an HTTP client asks (over the socket, where there is one): scheme and host, no path."""
        return f"http://{UNIX_HOST}" if self.socket is not None else f"http://{LOOPBACK}:{self.port}"

    @property
    def on_tcp(self) -> bool:
        """Any local user can reach it (127.0.0.1 is no boundary on a shared machine)."""
        return self.socket is None

    def __str__(self) -> str:
        return self.endpoint


def socket_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be an engine's socket (None: it can)."""
    if not path.startswith("/") or "\x00" in path or not path.endswith(SOCKET_SUFFIX):
        return f"engine socket {path[:200]!r} is not an absolute path ending in {SOCKET_SUFFIX}"
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        return f"engine socket {path[:200]!r} is longer than {MAX_SOCKET_PATH_BYTES} bytes (a unix socket's limit)"
    if "/../" in path or "/./" in path or "//" in path:
        return f"engine socket {path[:200]!r} is not a plain path"
    return None


def _endpoint(text: str) -> str:
    return EngineAddress.parse(text).endpoint


EngineEndpoint = Annotated[str, AfterValidator(_endpoint)]  # a ModelInfo's endpoint: parsed where it enters
