"""The CLI's OpenSSH one-shot session closes an ssh that has just exited without taking its exit status from asyncio's
child watcher (issue 30: an offline `cetlab status` printed "Unknown child process pid N")."""

from __future__ import annotations

from console.lab import openssh


async def test_closing_a_session_whose_ssh_still_runs_ends_it():
    session = await openssh.open_session(["sleep", "60"])
    await session.close()
    assert session.process.returncode == -15  # SIGTERM, through its pidfd
