"""Helper processes (a notification route's command, llama.cpp's adapter converter, a merge) get a small environment,
a timeout and bounded output, in one place (agents/runtime/children.py); issue 30's R11."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from agents.notify.sender import RouteSender
from agents.runtime.children import OUTPUT_KEEP_BYTES, run_helper
from agents.wire.lab.notify import CommandRoute, Notify
from agents.wire.sections.notify import Notification
from tests.support.waits import wait_for

NOTE = Notification(
    status="event",
    kind="job_finished",
    rule="job_finished",
    level="info",
    lab="t",
    machine="box",
    target="job box-1",
    message="done",
    at=time.time(),
)


def sender(argv: list[str], timeout_s: float = 20) -> RouteSender:
    route = CommandRoute(name="page", kind="command", argv=argv, timeout_s=timeout_s)
    return RouteSender(route, Notify(), outbox=None, base=None, firing=lambda _route: [])  # type: ignore[arg-type]


async def test_a_command_route_never_sees_the_agents_secrets(tmp_path: Path, monkeypatch):
    """The gateway's machine holds provider keys in its environment: a route's command gets PATH, HOME and the locale."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-labs-own-key")
    monkeypatch.setenv("CETLAB_ROUTE_TOKEN", "hunter2")
    seen = tmp_path / "env.txt"
    code = f"import os, sys; sys.stdin.read(); open({str(seen)!r}, 'w').write(repr(dict(os.environ))); print('paged')"
    delivery, permanent = await sender([sys.executable, "-c", code]).send(NOTE)
    assert delivery.ok and delivery.answer == "exit code 0: paged" and not permanent
    env = seen.read_text()
    assert "sk-the-labs-own-key" not in env and "hunter2" not in env
    assert "'PATH'" in env


async def test_a_command_that_floods_its_output_is_read_in_bounded_pieces_and_answers_its_last_line():
    flood = "import sys; sys.stdin.read(); out = sys.stdout; [out.write('x' * 65535 + '\\n') for _ in range(400)]; print('last')"
    delivery, _ = await sender([sys.executable, "-c", flood]).send(NOTE)
    assert delivery.ok and delivery.answer.endswith(": last")
    done = await run_helper([sys.executable, "-c", flood], timeout_s=20, env={}, stdin_data=b"")
    assert done.returncode == 0 and done.cut and len(done.output) <= OUTPUT_KEEP_BYTES
    assert done.output.endswith(b"last\n")


async def test_a_helper_past_its_timeout_is_killed_with_its_children(tmp_path: Path):
    fifo, pids = tmp_path / "never", tmp_path / "pids"
    os.mkfifo(fifo)
    # the helper and a child it starts both block on a FIFO nobody writes: the timeout kills the whole group
    script = tmp_path / "stuck.py"
    script.write_text(
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {f'open({str(fifo)!r}).read()'!r}])\n"
        f"open({str(pids)!r}, 'w').write(str(child.pid))\n"
        f"open({str(fifo)!r}).read()\n"
    )
    done = await run_helper([sys.executable, str(script)], timeout_s=2, env={})
    assert done.timed_out and done.returncode is None
    child = int(pids.read_text())

    def gone() -> bool:  # SIGKILL is sent to the group at the timeout; the kernel ends the child a moment later
        try:
            return psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await wait_for(gone, timeout=10)
    delivery, _ = await sender([sys.executable, str(script)], timeout_s=2).send(NOTE)
    assert not delivery.ok and "did not finish within 2 s: killed" in delivery.answer
