"""Nothing an RPC reaches blocks the agent's event loop (issue 30, item 6): a job's log read on a disk that does not answer,
an engine log or a model file replaced by a FIFO, and no `async def` in the agent calling a blocking function itself.

The ticks are the agent's own 1 Hz loop, noted as they run (as tests/e2e/gpusupport/test_gpu_support.py's R4 test does): while a read
hangs, they keep coming with a gap under 2 s."""

from __future__ import annotations

import ast
import json
import sys
import threading
import time
from pathlib import Path

import yaml

from agents.jobs import component as jobs_component
from agents.jobs.component import JobsComponent
from agents.runtime.rpc import Peer
from agents.shell.agent import Agent
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import GpuSample, Role
from tests.support.lab import REPO
from tests.support.waits import wait_for


def lab_with_trainer(tmp_path: Path) -> str:
    return yaml.safe_dump(
        {
            "lab": "t",
            "machines": [{"name": "box", "gpus": {"sim": [{"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}]}}],
            "trainers": [
                {
                    "name": "train",
                    "machine": "box",
                    "gpus": [0],
                    "command": [sys.executable, "-c", "print('\\n'.join(f'line {i}' for i in range(100)))"],
                    "output_dir": str(tmp_path / "runs/{job_id}"),
                }
            ],
        }
    )


async def test_a_job_log_on_a_disk_that_hangs_stalls_no_tick(tmp_path, monkeypatch):
    """jobs.logs reads in a thread with a timeout: while the read hangs the ticks keep their 1 Hz, the call answers
    UNAVAILABLE past READ_TIMEOUT_S (not a frozen agent), and once the disk answers the same call gets the lines."""
    agent = Agent(parse_lab(lab_with_trainer(tmp_path)), "box", tmp_path / "state", components=lambda core: [JobsComponent(core)])
    agent.serves_tcp = False
    tick_at: list[float] = []
    one_tick = agent.tick

    def noted_tick(gpus: list[GpuSample] | None = None) -> None:
        tick_at.append(time.monotonic())
        one_tick(gpus)

    agent.tick = noted_tick  # type: ignore[method-assign]
    jobs = agent.find(JobsComponent)
    assert jobs is not None
    peer = Peer(role=Role.OPERATOR, who="test", send=lambda line: None)
    await agent.start()
    released = threading.Event()  # the disk answers when the test says so
    real_tail = jobs_component.tail

    def hung_tail(path: Path, lines: int):  # type: ignore[no-untyped-def]
        released.wait(60)
        return real_tail(path, lines)

    try:
        job = jobs.start_job("train", {})
        await wait_for(lambda: not job.active and Path(job.log_path).is_file(), 30)
        monkeypatch.setattr(jobs_component, "tail", hung_tail)
        monkeypatch.setattr(jobs_component, "READ_TIMEOUT_S", 2.5)
        ask = {"id": 1, "method": "jobs.logs", "params": {"id": job.id, "tail_lines": 10}}
        await wait_for(lambda: len(tick_at) >= 2, 20)
        count = len(tick_at)
        reply = await agent.rpc.dispatch(peer, ask)  # hangs past the timeout: the loop went on meanwhile
        assert reply["error"]["code"] == "unavailable" and "took over" in reply["error"]["message"], reply
        await wait_for(lambda: len(tick_at) >= count + 3, 20)
        gaps = [b - a for a, b in zip(tick_at[count - 1 :], tick_at[count:])]  # from the tick before the call
        assert gaps and max(gaps) < 2.0, gaps
        released.set()
        reply = await agent.rpc.dispatch(peer, {**ask, "id": 2})
        assert reply["result"]["lines"][-1] == "line 99", reply
    finally:
        released.set()
        await agent.stop()


async def test_a_followed_log_on_a_disk_that_hangs_stalls_no_tick(tmp_path, monkeypatch):
    """A follower's new lines are read before a tick, in a thread: while that read hangs the ticks keep their 1 Hz and
    the follower gets nothing; once the disk answers, its lines and the end of the log come, each once."""
    agent = Agent(parse_lab(lab_with_trainer(tmp_path)), "box", tmp_path / "state", components=lambda core: [JobsComponent(core)])
    agent.serves_tcp = False
    tick_at: list[float] = []
    one_tick = agent.tick

    def noted_tick(gpus: list[GpuSample] | None = None) -> None:
        tick_at.append(time.monotonic())
        one_tick(gpus)

    agent.tick = noted_tick  # type: ignore[method-assign]
    jobs = agent.find(JobsComponent)
    assert jobs is not None
    pushed: list[dict] = []
    peer = Peer(role=Role.OPERATOR, who="test", send=lambda line: pushed.append(json.loads(line)))
    released = threading.Event()
    real_read = jobs_component._read_follower

    def hung_read(follower):  # type: ignore[no-untyped-def]
        released.wait(60)
        return real_read(follower)

    monkeypatch.setattr(jobs_component, "_read_follower", hung_read)
    await agent.start()
    try:
        job = jobs.start_job("train", {})
        await wait_for(lambda: not job.active and Path(job.log_path).is_file(), 30)
        reply = await agent.rpc.dispatch(
            peer, {"id": 1, "method": "jobs.logs", "params": {"id": job.id, "offset": 0, "follow": True}}
        )
        assert reply["result"]["offset"] >= 0, reply
        count = len(tick_at)
        await wait_for(lambda: len(tick_at) >= count + 3, 20)
        gaps = [b - a for a, b in zip(tick_at[count - 1 :], tick_at[count:])]
        assert max(gaps) < 2.0, gaps
        released.set()
        ended = lambda: [e for e in pushed if e.get("event") == "log" and e["data"].get("ended")]  # noqa: E731
        await wait_for(lambda: ended(), 20)
        assert len(ended()) == 1
    finally:
        released.set()
        await agent.stop()


# calls an `async def` of the agent must never make itself: each waits on a process, a disk or the clock with the loop held
BLOCKING = {("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "call"), ("subprocess", "check_output")}


BLOCKING |= {("time", "sleep"), ("os", "system"), ("os", "walk"), ("shutil", "copytree"), ("shutil", "rmtree")}


BLOCKING_METHODS = {"read_text", "read_bytes", "check_output", "check_call"}


# (module, function): why the call is short and bounded
ALLOWED = {
    ("agents/orchestra/engine.py", "start", "open"): "the engine's log, opened for append to hand its fd to the child",
    ("agents/orchestra/spread.py", "_spawn", "open"): "rpc-server's log, opened for append to hand its fd to the child",
    ("agents/jobs/multinode.py", "_hold_port", "open"): "the job's own log, opened for append to note a retry",
    ("agents/shell/daemon.py", "serve", ".write_text"): "the ready file (a port number) written once, before any call",
}


def blocking_calls(path: Path) -> list[tuple[str, str, int]]:
    """(function, call, line) for each blocking call made directly in an `async def` of the file (not in a function
    defined inside it, which a thread may run)."""
    found: list[tuple[str, str, int]] = []

    def visit(fn: ast.AsyncFunctionDef, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in BLOCKING:
                    found.append((fn.name, f"{f.value.id}.{f.attr}", child.lineno))
                elif isinstance(f, ast.Attribute) and f.attr in BLOCKING_METHODS:
                    found.append((fn.name, f".{f.attr}", child.lineno))
                elif isinstance(f, ast.Name) and f.id == "open":
                    found.append((fn.name, "open", child.lineno))
            visit(fn, child)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.AsyncFunctionDef):
            visit(node, node)
    return found


def test_no_async_def_of_the_agent_calls_a_blocking_function():
    """A handler or what it awaits reads files and runs processes through asyncio (create_subprocess_exec, run_helper)
    or in a thread (asyncio.to_thread, read_capped_async): none calls subprocess.run, open or read_text itself."""
    offenders = []
    for path in sorted((REPO / "agents").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for function, call, line in blocking_calls(path):
            if (rel, function, call) not in ALLOWED:
                offenders.append(f"{rel}:{line} {function}: {call}")
    assert not offenders, "blocking calls on the event loop:\n" + "\n".join(offenders)


def test_the_scan_finds_a_blocking_call(tmp_path):
    """The scan is not blind: a handler that calls subprocess.run, open or read_text is found; the same calls in a
    function it hands to a thread are not."""
    sample = tmp_path / "handler.py"
    sample.write_text(
        "import subprocess\n"
        "async def handler(path):\n"
        "    subprocess.run(['x'])\n"
        "    open(path)\n"
        "    def in_thread():\n"
        "        return path.read_text()\n"
        "    return await asyncio.to_thread(in_thread)\n"
    )
    assert [(f, c) for f, c, _ in blocking_calls(sample)] == [("handler", "subprocess.run"), ("handler", "open")]
