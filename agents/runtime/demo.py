"""The demo lab's folder and its process's two-line answer: what the demo's process writes and the console reads.

The demo lab is built and its agents run by `python -m agents.shell.demo --dir DIR`; the console starts that as a child
process and knows it only through what is here: the names in DIR and the line the child prints when it is ready.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DEMO_DIR_NAME = ".cetlab-demo"  # the demo's folder in a checkout (git-ignored), as the checkout's lab.yaml names it
LAB_FILE = "lab.yaml"  # DIR/lab.yaml: the client-side lab, with this start's ports and keys
LOCK_NAME = "demo.lock"  # held by the demo's process while its agents run; holds its pid
GATEWAY_KEY_FILE = "console/gateway.key"  # the demo's gateway API key (mode 600)
# set: the demo's gateway takes a free port even where lab.yaml's is free (tests, many demos at once)
ANY_GATEWAY_PORT_ENV = "CETLAB_DEMO_ANY_GATEWAY_PORT"
NOTIFICATIONS_FILE = "notifications.jsonl"  # what the simulated webhook receiver got, one JSON line each

# The demo's process prints exactly one of these on its stdout: READY once every agent accepts connections, FAILED with
# the reason (another demo runs from DIR, an agent died) before it exits.
READY = "ready "
FAILED = "failed "


def shown_path(path: Path) -> str:
    """A path as a person would type it here: relative to the working folder when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def cli_program() -> str:
    """How to type `cetlab` here: bare when on PATH, else the one beside this Python (make does not activate .venv)."""
    return "cetlab" if shutil.which("cetlab") else shown_path(Path(sys.executable).parent / "cetlab")


def demo_cli_line(directory: Path) -> str:
    """The CLI line that talks to the demo lab of DIR (while its agents run)."""
    return f"{cli_program()} --lab {shown_path(directory / LAB_FILE)} status"
