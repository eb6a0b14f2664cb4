"""The demo lab as the console sees it: a child process (`python -m agents.shell.demo`) and the folder it keeps.

The lab's builder and its agents live on the agent's side; the console starts that process, reads its one line
(ready, or why not), opens DIR/lab.yaml, and stops the process on the way out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from platformdirs import user_state_path

from agents.runtime.demo import (
    ANY_GATEWAY_PORT_ENV,
    DEMO_DIR_NAME,
    FAILED,
    GATEWAY_KEY_FILE,
    LAB_FILE,
    LOCK_NAME,
    NOTIFICATIONS_FILE,
    READY,
    cli_program,
    demo_cli_line,
    shown_path,
)
from agents.wire.lab.model import load_lab
from agents.wire.lab.notify import WebhookRoute

REPO_ROOT = Path(__file__).resolve().parents[2]
STOP_WAIT_S = 30.0  # the demo's process stops its agents (5 s each at most) before it exits


def default_demo_dir() -> Path:
    """Where the demo lab keeps its lab file, keys, agent state, runs and checkpoints across restarts.

    In a checkout: its git-ignored `.cetlab-demo/`; installed from a wheel: the user's state folder.
    """
    if (REPO_ROOT / LAB_FILE).exists() and os.access(REPO_ROOT, os.W_OK):
        return REPO_ROOT / DEMO_DIR_NAME
    return user_state_path("cetlab") / "demo"


def bundled_lab() -> Path:
    """The demo lab.yaml: the repository's, or the copy shipped inside the wheel."""
    repo = REPO_ROOT / LAB_FILE
    if repo.exists():
        return repo
    return Path(str(resources.files("console") / "demo_lab.yaml"))


def demo_cli_hint(lab_path: Path | None) -> str | None:
    """The CLI line for the lab a console shows, when that lab is a demo's (for the help screen); else None."""
    if lab_path is None or not (lab_path.parent / LOCK_NAME).exists():
        return None
    return demo_cli_line(lab_path.parent)


def demo_quit_message(directory: Path, gateway: str = "") -> str:
    """What the console prints when the demo stops: where its lab is kept, where its gateway was (``gateway``:
    describe_gateway's lines) and how to reach it again."""
    return (
        f"the demo lab stopped; its lab file, runs and checkpoints stay in {shown_path(directory)}/ for the next `make demo`.\n"
        f"{gateway}  headless: {cli_program()} demo, then in another terminal: {demo_cli_line(directory)}"
    )


def is_demo_source(lab_path: Path) -> bool:
    """True when lab_path is the demo lab's source: its machines' ports are placeholders, the demo writes the real ones."""
    try:
        return lab_path.resolve() == bundled_lab().resolve()
    except OSError:
        return False


def describe_gateway(directory: Path, lab_path: Path, source: Path | None = None, try_line: bool = True) -> str:
    """Where the demo's gateway listens and where its key is, and why its port is not the one the source lab
    (``source``) names when it is not; with a curl to try ('' without a gateway)."""
    gateway = load_lab(lab_path).gateway
    key_file = directory / GATEWAY_KEY_FILE
    if gateway is None or not key_file.exists():
        return ""
    named = load_lab(source).gateway if source is not None else None
    why = ""
    if named is not None and named.port and named.port != gateway.port:
        because = f"{ANY_GATEWAY_PORT_ENV} is set" if os.environ.get(ANY_GATEWAY_PORT_ENV) else "it was taken"
        why = f"; not lab.yaml's port {named.port}: {because}"
    said = f"  gateway: {gateway.url} (key in {key_file}{why})\n"
    if not try_line:
        return said
    return (
        said + f'  try: curl -s {gateway.url}/chat/completions -H "Authorization: Bearer $(cat {key_file})" '
        f'-H \'Content-Type: application/json\' -d \'{{"model": "phi-3-mini", "messages": [{{"role": "user", "content": "hi"}}]}}\'\n'
    )


def describe_notify(directory: Path, lab_path: Path) -> str:
    """Where the demo's notifications arrive ('' without a simulated route)."""
    if not any(isinstance(r, WebhookRoute) and r.simulated and r.url_file for r in load_lab(lab_path).notify.routes):
        return ""
    return (
        f"  notifications (SIM receiver): tail -f {directory / NOTIFICATIONS_FILE}\n"
        f"  try: a hot GPU: cetlab --lab {lab_path} sim-override m5 --gpu 0 --temp-c 95 (then --clear)\n"
    )


class DemoProcess:
    """The demo lab's process, started by the console: `start` returns once its agents listen (RuntimeError if not)."""

    def __init__(
        self, directory: Path, source: Path | None = None, scale: int | None = None, agents_per_process: int | None = None
    ):
        self.dir = directory.resolve()
        self.source = source or bundled_lab()
        self.scale = scale
        self.agents_per_process = agents_per_process
        self.lab_path = self.dir / LAB_FILE
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        load_lab(self.source)  # a broken source lab is the console's LabError (file and line), said before any process
        argv = [sys.executable, "-m", "agents.shell.demo", "--dir", str(self.dir), "--source", str(self.source)]
        argv += ["--parent-pid", str(os.getpid())]
        if self.scale:
            argv += ["--scale", str(self.scale)]
        if self.agents_per_process:
            argv += ["--agents-per-process", str(self.agents_per_process)]
        # its own session: a Ctrl-C at the terminal reaches the console, which stops the demo in order
        self._process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True
        )
        assert self._process.stdout is not None  # stdout=PIPE
        line = self._process.stdout.readline()  # the child's one line: it bounds its own start (agents.shell.demo)
        if line.startswith(READY):
            self.lab_path = Path(line[len(READY) :].strip())
            return
        self.stop()
        if line.startswith(FAILED):
            raise RuntimeError(json.loads(line[len(FAILED) :]))
        raise RuntimeError(f"the demo lab's process exited with code {self._process.returncode} before its agents listened")

    def stop(self) -> None:
        """Stop the demo's process (it stops its agents first); a process that does not stop in STOP_WAIT_S is killed."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
