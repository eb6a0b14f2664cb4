"""What files can do to an agent: forged key comments, lab.yaml bombs, a broken state.db, a taken socket, a hung component."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import asyncssh
import pytest
import yaml

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, ensure_key
from agents.shell.demo.lab import free_ports
from agents.wire.agent_argv import agent_argv, python_agent
from agents.wire.lab.model import load_lab
from tests.support.agent_exits import _ran_once, wait_exit
from tests.support.agent_process import (
    PY,
    connected,
    one_machine_lab,
    start_agent,
    wait_listening,
)
from tests.support.waits import wait_until

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def run_cli(*argv: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *argv], input=stdin, capture_output=True, timeout=timeout)


# ---------------------------------------------------------------------------- authorize (finding 4)


async def test_authorize_refuses_a_comment_that_smuggles_a_second_key(small_demo, tmp_path):
    state = small_demo.dir / "agents" / "box"
    attacker = ensure_key(tmp_path / "attacker", comment="eve")
    bob = ensure_key(tmp_path / "bob", comment="bob")
    forged = (
        f"{bob.export_public_key().decode().split()[0]} {bob.export_public_key().decode().split()[1]} "
        f"bob\x1eoperator {' '.join(attacker.export_public_key().decode().split()[:2])} eve\n"
    )
    before = (state / AUTHORIZED_KEYS_NAME).read_bytes()
    for text in (
        forged,
        forged.replace("\x1e", "\u2028"),
        bob.export_public_key().decode() + attacker.export_public_key().decode(),
    ):
        pub = tmp_path / "bob.pub"
        pub.write_text(text)
        done = run_cli(
            "-m", "agents.shell.daemon", "authorize", "--machine", "box", "--state-dir", str(state), "--role", "viewer", str(pub)
        )
        assert done.returncode == 2, done
        assert len(done.stderr.decode().strip().splitlines()) == 1, done.stderr
    assert (state / AUTHORIZED_KEYS_NAME).read_bytes() == before
    # a file written before this check (or by hand) with such a line: the agent trusts no key in it, not the smuggled one
    (state / AUTHORIZED_KEYS_NAME).write_bytes(before + f"viewer {forged}".encode())
    lab = load_lab(small_demo.lab_path)
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            "127.0.0.1",
            lab.machine("box").port,
            username="cetlab",
            client_keys=[str(tmp_path / "attacker")],
            known_hosts=str(lab.resolve(lab.console.known_hosts)),
            agent_path=None,
            config=None,
        )
    (state / AUTHORIZED_KEYS_NAME).write_bytes(before)
    ok = run_cli(
        "-m",
        "agents.shell.daemon",
        "authorize",
        "--machine",
        "box",
        "--state-dir",
        str(state),
        "--role",
        "viewer",
        "-",
        stdin=bob.export_public_key(),
    )
    assert ok.returncode == 0 and "authorized bob as viewer" in ok.stdout.decode()


# ---------------------------------------------------------------------------- lab.yaml (finding 8)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("bomb", ALIAS_BOMB, "aliases expand to more than"),
        ("deep", "lab: x\nmachines: " + "[" * 10000 + "]" * 10000 + "\n", ":2: nested deeper than"),
        ("bigint", "lab: x\nmachines:\n- name: a\n  idle_watts: " + "9" * 5000 + "\n", ":4: a number of 5000 characters"),
        ("latin1", b"lab: x\n# caf\xe9\nmachines: []\n", ":2: not UTF-8"),
        ("huge", "lab: x\nmachines: []\n" + "# padding\n" * 400_000, "larger than"),
    ],
    ids=["alias-bomb", "deep", "bigint", "latin1", "huge"],
)
def test_a_lab_file_bomb_is_one_line_and_exit_2(tmp_path, name, content, expected):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    started = time.monotonic()
    done = run_cli("-m", "console.cli.main", "--lab", str(path), "status", timeout=60)
    lines = done.stderr.decode().strip().splitlines()
    print(f"\n{name}: {len(content)} bytes refused in {time.monotonic() - started:.1f} s: {lines[-1] if lines else ''}")
    named = [line for line in lines if line.startswith(str(path))]  # the CLI heads its problems with one line of its own
    assert done.returncode == 2 and len(lines) <= 2 and len(named) == 1 and expected in named[0], (done.returncode, lines[:3])
    agent = subprocess.run(
        agent_argv(python_agent(PY), path, "a", tmp_path / "state"),
        capture_output=True,
        timeout=60,
    )
    lines = agent.stderr.decode().strip().splitlines()
    assert agent.returncode == 2 and len(lines) == 1 and expected in lines[0], (agent.returncode, lines[:3])


# ---------------------------------------------------------------------------- state.db (finding 9)


def _state_db_rows(state: Path, sql: str) -> list:
    with sqlite3.connect(state / "state.db") as db:
        return db.execute(sql).fetchall()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "emptied", "deleted"])
async def test_a_broken_state_db_is_moved_aside_and_said_never_a_silent_empty_start(small_demo, damage):
    small_demo.stop()
    state = small_demo.dir / "agents" / "box"
    await _ran_once(small_demo.lab_path, state)
    db = state / "state.db"
    data = db.read_bytes()
    if damage == "garbage":
        db.write_bytes(data[:100] + os.urandom(4096) + data[4196:])
    elif damage == "truncated":
        db.write_bytes(data[: len(data) // 3])
    elif damage == "emptied":
        db.write_bytes(b"")
    else:
        db.unlink()
    proc = start_agent(small_demo.lab_path, state, log_level="info")
    port = yaml.safe_load(small_demo.lab_path.read_text())["machines"][0]["port"]
    try:
        wait_listening("127.0.0.1", port, proc)
        client = await connected(small_demo.lab_path)
        try:
            trail = await client.call("box", "audit.list", {"limit": 10})
            said = [e for e in trail["entries"] if e["outcome"] == "state_lost"]
            assert said and "start empty" in said[0]["message"], trail["entries"]
        finally:
            await client.stop()
    finally:
        proc.terminate()
        assert wait_exit(proc, 30) == 0
    log = proc.stderr.read().decode()
    assert "CRITICAL" in log and "start empty" in log and "Traceback" not in log, log[-2000:]
    aside = sorted(state.glob("state.db.corrupt-*"))
    if damage == "deleted":
        assert "was missing" in log
    else:
        moved = [p for p in aside if p.name.count("-") == 1]  # the file itself (its -wal and -shm went with it)
        assert moved and ("corrupt" in log or "was empty" in log)
        assert (moved[0].stat().st_size == 0) == (damage == "emptied")


def test_a_state_db_that_cannot_be_opened_is_one_line(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "state.db").mkdir()  # not a file: SQLite cannot open it
    proc = start_agent(lab_path, state)
    assert wait_exit(proc, 60) == 1
    lines = proc.stderr.read().decode().strip().splitlines()
    assert len(lines) == 1 and "state.db" in lines[0] and "Traceback" not in lines[0], lines


# ---------------------------------------------------------------------------- the unix socket (finding 10)


async def test_a_second_agent_on_a_live_agents_socket_is_refused(tmp_path):
    lab_path = one_machine_lab(tmp_path / "lab.yaml")
    sock = tmp_path / "s" / "agent.sock"
    first = start_agent(lab_path, tmp_path / "state1", "--unix-socket", str(sock))
    try:
        wait_listening("127.0.0.1", yaml.safe_load(lab_path.read_text())["machines"][0]["port"], first)
        link = tmp_path / "link.sock"
        link.symlink_to(sock)
        for given in (sock, link):
            second = start_agent(
                lab_path, tmp_path / "state2", "--unix-socket", str(given), "--listen", f"127.0.0.1:{free_ports(1)[0]}"
            )
            assert wait_exit(second, 60) == 2
            lines = second.stderr.read().decode().strip().splitlines()
            assert len(lines) == 1 and "another agent serves" in lines[0], lines
        with socket.socket(socket.AF_UNIX) as s:  # the first agent still answers on its socket
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(b'{"id": 1, "method": "hello"}\n')
            assert b'"machine":"box"' in s.recv(65536)
    finally:
        first.terminate()
        assert wait_exit(first, 30) == 0
    # a killed agent's leftover socket is taken over without fuss
    killed = start_agent(lab_path, tmp_path / "state1", "--unix-socket", str(sock))
    wait_listening("127.0.0.1", yaml.safe_load(lab_path.read_text())["machines"][0]["port"], killed)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert sock.exists()
    again = start_agent(lab_path, tmp_path / "state2", "--unix-socket", str(sock))
    try:
        wait_listening("127.0.0.1", yaml.safe_load(lab_path.read_text())["machines"][0]["port"], again)
    finally:
        again.terminate()
        wait_exit(again, 30)


# ---------------------------------------------------------------------------- SIGTERM (a hung component)


def test_sigterm_stops_the_agent_within_its_grace_even_while_a_component_hangs(tmp_path):
    runs = tmp_path / "runs"
    for suffix in ("1", "2"):  # two long run names that are equal once cut to 64 characters
        (runs / ("r" * 70 + suffix) / "checkpoint-1").mkdir(parents=True)
    lab_path = one_machine_lab(tmp_path / "lab.yaml", checkpoints={"dirs": [{"machine": "box", "path": str(runs)}]})
    state = tmp_path / "state"
    proc = start_agent(lab_path, state, "--stop-grace", "3")
    try:

        def started_its_parts() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            return (state / "agent.pid").exists()

        wait_until(started_its_parts, 60)
        # whatever a part is doing now (hanging or not), SIGTERM must end it
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 30)
        print(f"\nstopped {time.monotonic() - started:.1f} s after SIGTERM (grace 3 s), exit {code}")
        assert code is not None, "still running 30 s after SIGTERM"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
