"""The agent's command line, spelled once: the systemd unit, `machine add`'s detached start, the demo lab, the benches
and the tests all start `cetlab-agent serve` through agent_argv. Its flags are those of the daemon's own parser
(agents/shell/daemon.py build_parser); a test parses what this writes with that parser, so the two cannot drift."""

from __future__ import annotations

import os
from collections.abc import Sequence

AGENT_MODULE = "agents.shell.daemon"  # `python -m agents.shell.daemon` is `cetlab-agent`

StrPath = str | os.PathLike[str]


def python_agent(python: str) -> list[str]:
    """The agent run by this Python: for a checkout or a venv without its console script on PATH."""
    return [python, "-m", AGENT_MODULE]


def agent_argv(
    program: Sequence[str],
    lab: StrPath,
    machines: str | Sequence[str],
    state_dir: StrPath,
    *,
    log_level: str | None = None,
    keep_engines: bool = False,
    unix_socket: StrPath | None = None,
    parent_pid: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`PROGRAM [--log-level L] serve --lab LAB --machine M... --state-dir DIR [...]`: the agent serving these machines.

    ``program`` is how the agent is run: ``[".../bin/cetlab-agent"]`` or python_agent(sys.executable).
    """
    argv = [*program, *(["--log-level", log_level] if log_level else []), "serve", "--lab", os.fspath(lab)]
    for machine in [machines] if isinstance(machines, str) else machines:
        argv += ["--machine", machine]
    argv += ["--state-dir", os.fspath(state_dir)]
    if keep_engines:
        argv.append("--keep-engines")
    if unix_socket is not None:
        argv += ["--unix-socket", os.fspath(unix_socket)]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    return [*argv, *extra]
