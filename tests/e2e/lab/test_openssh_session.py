"""The CLI's OpenSSH one-shot session closes an ssh that has just exited without taking its exit status from asyncio's
child watcher (issue 30: an offline `cetlab status` printed "Unknown child process pid N")."""

from __future__ import annotations

import logging
import os

from console.lab import openssh


async def test_closing_a_session_whose_ssh_just_exited_leaves_its_exit_to_the_child_watcher(caplog):
    # an offline machine's ssh exits on its own (refused, timed out) about when the CLI closes the link: the close
    # signalled it through Popen, whose poll reaped it first (11 of 100 closes here printed the warning)
    codes = []
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(100):
            session = await openssh.open_session(["true"])
            try:  # until it has exited, without reaping it (the watcher's thread may have already)
                os.waitid(os.P_PID, session.process.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            await session.close()
            codes.append(session.process.returncode)
    assert not [r.getMessage() for r in caplog.records if "child process" in r.getMessage()]
    assert codes == [0] * 100  # its real exit code, never the watcher's 255 for a child it could not find
