"""Engines listen where their agent says (a unix socket of its own, or 127.0.0.1 only): the checks on what lab.yaml
gives an engine's command line.

The gateway reaches other machines' engines through their agent's SSH connection, and an engine's endpoints
(vLLM's /sleep, /collective_rpc, adapter loading; whatever a `command` server offers) have no authentication.
"""

from __future__ import annotations

import re

ON_LOOPBACK = (
    "engines listen on 127.0.0.1 only (the gateway reaches other machines' engines through their agent's SSH connection)"
)


# Flags that would move where an engine listens (vLLM, transformers serve, llama-server): the agent's own say it (a unix
# socket in its private folder, or a model's port:)
BIND_FLAGS = frozenset({"--host", "--port", "--uds"})


# a wildcard host (0.0.0.0, [::], ::, *) as a whole argument or after =, @, / or a comma, before its end or a port
_WILDCARD = re.compile(r"(?:^|[=\s@/,])(?:0\.0\.0\.0|\[::\]|::|\*)(?=$|[:\s,/])")


def binds_everywhere(arg: str) -> bool:
    """A command argument that names a wildcard address (0.0.0.0, ::, [::], *), alone or as `--host=0.0.0.0`, `0.0.0.0:8000`."""
    return _WILDCARD.search(arg.strip()) is not None


def binds_elsewhere(arg: str) -> bool:
    """An engine argument that sets where it listens: a bind flag, or (Python's argparse, which vLLM, `transformers
    serve` and the sim engines parse with, takes any unambiguous prefix of a long option) an abbreviation of one,
    `--hos 0.0.0.0` or `--ho=0.0.0.0`."""
    flag = arg.split("=", 1)[0]
    return flag in BIND_FLAGS or (len(flag) > 3 and any(bind.startswith(flag) for bind in BIND_FLAGS))


def check_args(args: list[str]) -> list[str]:
    """A model's args (added to the agent's own flags, which bind 127.0.0.1): no flag of theirs may move it."""
    for arg in args:
        if binds_elsewhere(arg):
            raise ValueError(f"{arg!r}: {ON_LOOPBACK}; remove it from args")
    return args


def check_command(argv: list[str]) -> list[str]:
    """An engine: command line (or its stop command): no wildcard address anywhere in it."""
    for arg in argv:
        if binds_everywhere(arg):
            raise ValueError(f"{arg!r}: {ON_LOOPBACK}; bind the server to 127.0.0.1")
    return argv


def command_engine_problem(engine: str, command: list[str], stop_command: list[str], port: int | None) -> str | None:
    """What is wrong with a model's command keys (None: nothing): only engine: command has them, and it needs them."""
    if engine != "command":
        if command or stop_command:
            return f"command and stop_command are for engine: command, not engine: {engine}"
        return None
    if not command:
        return "engine: command needs command: [argv ...] (the server's command line, with {port} and {model})"
    if any("{socket}" in arg for arg in command):
        if port is not None:
            return "engine: command: its command listens on {socket} (a unix socket of the agent's): it takes no port:"
        return None  # the server listens on the socket the agent names, in its private folder: no other user reaches it
    if not any("127.0.0.1" in arg for arg in command):
        return f"engine: command: its command must bind 127.0.0.1 (e.g. --host 127.0.0.1) or {{socket}}: {ON_LOOPBACK}"
    if port is None and not any("{port}" in arg for arg in command):
        return "engine: command: its command needs {socket} (a unix socket) or {port} (the agent picks a free port), or give the model a port:"
    return None
