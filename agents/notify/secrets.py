"""A route's URL and token, read where the operator keeps them (the environment, a file of mode 600), and kept out of text."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agents.wire.lab.notify import CommandRoute, HttpRoute

MAX_SECRET_BYTES = 8192
REDACTED = "<secret>"


class SecretError(Exception):
    """A route's secret cannot be read; str() says where it was looked for and what to do (never the secret)."""


@dataclass(frozen=True)
class Endpoint:
    """What the sender needs to reach a route; `secrets` are the strings never to show."""

    url: str
    token: str | None
    secrets: tuple[str, ...]


def describe(route: HttpRoute | CommandRoute) -> str:
    """Where a route sends, shown to consoles: a clear URL as written, else where its secret lives."""
    if isinstance(route, CommandRoute):
        return " ".join(route.argv)[:200]
    if route.url is not None:
        return route.url
    if route.url_env is not None:
        return f"${route.url_env}"
    return f"file {route.url_file}"


def _read(env: str | None, file: str | None, base: Path | None, what: str) -> str | None:
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise SecretError(
                f"{what}: ${env} is not set in the agent's environment (set it in the unit's Environment= or EnvironmentFile=)"
            )
        return value.strip()
    if file is None:
        return None
    path = Path(file).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SecretError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"{what}: {path} is not a regular file")
        if info.st_mode & 0o077:
            raise SecretError(f"{what}: {path} is mode {stat.S_IMODE(info.st_mode):04o}, readable by others: chmod 600 {path}")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretError(f"{what}: {path} is larger than {MAX_SECRET_BYTES} bytes; it should hold one line")
    value = data.decode("utf-8", "replace").strip()
    if not value:
        raise SecretError(f"{what}: {path} is empty")
    return value


def endpoint(route: HttpRoute, base: Path | None) -> Endpoint:
    """The route's URL and token as the agent reads them now (a rotated secret is picked up at the next send)."""
    url = route.url if route.url is not None else _read(route.url_env, route.url_file, base, f"route {route.name} url")
    assert url is not None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        secret_where = f"${route.url_env}" if route.url_env else f"{route.url_file}"
        raise SecretError(f"route {route.name} url: what {secret_where} holds is not an http:// or https:// URL")
    token = _read(route.token_env, route.token_file, base, f"route {route.name} token")
    secrets: list[str] = []
    if route.url is None:
        secrets += [url, url.rstrip("/")]
        if parts.path not in ("", "/"):
            secrets.append(parts.path)  # a hook's token is its path (Slack, Discord): an error may name the path alone
        if parts.query:
            secrets.append(parts.query)
        if parts.password:
            secrets.append(parts.password)
        if parts.username:
            secrets.append(parts.username)  # https://TOKEN@host: the token is the user
        last = parts.path.rstrip("/").rsplit("/", 1)[-1]
        if len(last) >= 8:
            secrets.append(last)  # a hook's token is its last segment (Slack's T../B../<token>): an error may echo it alone
    if token:
        secrets.append(token)
    return Endpoint(url, token, tuple(sorted(set(secrets), key=len, reverse=True)))


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every secret (longest first) replaced."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text
