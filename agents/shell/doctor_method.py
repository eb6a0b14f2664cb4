"""`doctor.run`: a running agent's doctor, over the wire (what `cetlab lab doctor` asks of every machine).

The checks block (NVML, a subprocess per Python for its torch, up to 20 s each; files; sockets), so they run in a thread
off the agent's loop, with a deadline: what did not finish by then is said as such, and the thread is left to end on its
own (one at a time: a call while one runs waits on that one). The peer links are read on the loop, from the components
that keep them (PeerLinksPort), as this agent's side of each pair: this machine to each peer it needs.
"""

from __future__ import annotations

import asyncio
import logging
import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from agents import __version__
from agents.runtime.peer_links import PeerLinksPort
from agents.shell.doctor import FAIL, OK, WARN, Check, check_steps
from agents.wire.catalogue.doctor import DOCTOR_RUN, DoctorCheck, DoctorParams, DoctorReport
from agents.wire.protocol import LinkStatus

if TYPE_CHECKING:
    from agents.runtime.rpc import Peer
    from agents.shell.agent import Agent

log = logging.getLogger("cetlab.doctor")


class DoctorRun:
    """One run of the checks in a thread: the lines done so far, and the step running now."""

    def __init__(self, agent: Agent) -> None:
        self.done: list[Check] = []
        self.step = ""
        self.lock = threading.Lock()
        steps = check_steps(agent.lab, agent.machine.name, agent.state_dir, held_ports())

        def work() -> None:
            for what, step in steps:
                self.step = what
                try:
                    found = step()
                except Exception as exc:  # one check's bug is that check's line, never the whole doctor
                    log.exception("doctor: the %s check failed", what)
                    found = [Check(what, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}")]
                with self.lock:
                    self.done.extend(found)
            self.step = ""

        self.future = asyncio.ensure_future(asyncio.to_thread(work))

    def lines(self) -> list[Check]:
        with self.lock:
            return list(self.done)


def held_ports() -> frozenset[int]:
    """The TCP ports this agent's process and its children (engines) listen on: theirs, not a conflict."""
    ports: set[int] = set()
    try:
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                ports.update(c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN)
            except (psutil.Error, OSError):
                continue
    except (psutil.Error, OSError):
        pass
    return frozenset(ports)


def peer_file_checks(key: Path, known_hosts: Path) -> list[Check]:
    """The peer key readable by this agent's user only; its known hosts writable by no one else (else anyone could add one)."""
    checks = []
    for path, too_open, want in ((key, stat.S_IRWXG | stat.S_IRWXO, 0o600), (known_hosts, stat.S_IWGRP | stat.S_IWOTH, 0o600)):
        if not path.exists():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & too_open:
            checks.append(Check(f"peer file {path.name}", FAIL, f"{path} is too open (mode {mode:o})", f"chmod {want:o} {path}"))
        else:
            checks.append(Check(f"peer file {path.name}", OK, f"{path} (mode {mode:o})"))
    return checks


def peer_checks(agent: Agent) -> list[Check]:
    """This agent to each peer it needs (the gateway's machines, a multi-node coordinator's nodes), with the fix; and
    the files of each of its peer keys."""
    checks = []
    for component in agent.components:
        if not isinstance(component, PeerLinksPort):
            continue
        links = component.peer_links()
        if links:
            checks += peer_file_checks(links[0].key_path, links[0].known_hosts)
        for link in links:
            level = OK if link.status is LinkStatus.ONLINE else WARN if link.status is LinkStatus.CONNECTING else FAIL
            said = f"{link.purpose} link to {link.machine}: {link.status}" + (f" ({link.error})" if link.error else "")
            checks.append(Check(f"peer → {link.machine}", level, said, link.fix(agent.lab)))
    return checks


def register(agent: Agent) -> None:
    running: list[DoctorRun] = []  # the run in flight, if any

    @agent.rpc.implements(DOCTOR_RUN)
    async def doctor_run(peer: Peer, params: DoctorParams) -> DoctorReport:
        if not running or running[0].future.done():
            running[:] = [DoctorRun(agent)]
        run = running[0]
        complete = True
        try:
            async with asyncio.timeout(params.timeout_s):
                await asyncio.shield(run.future)
        except TimeoutError:
            complete = False
        checks = run.lines()
        if not complete:
            checks.append(
                Check(
                    f"doctor: {run.step or 'checks'}",
                    WARN,
                    f"the {run.step or 'last'} check did not finish within {params.timeout_s:.0f} s: it and the checks "
                    "after it are not said (a torch import on a loaded machine can take 20 s)",
                    f"cetlab lab doctor --within {params.timeout_s * 2:.0f}",
                )
            )
        checks += peer_checks(agent)
        return DoctorReport(
            machine=agent.machine.name,
            agent_version=__version__,
            checks=[DoctorCheck(name=c.name, level=c.level, message=c.message, fix=c.fix) for c in checks],
            complete=complete,
        )
