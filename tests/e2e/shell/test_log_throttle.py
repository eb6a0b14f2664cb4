"""The agent holds back asyncio's per-write "socket.send() raised exception." lines (thousands for a peer that left):
a real agent process, real asyncio transports writing to a socket whose far end is gone."""

from __future__ import annotations

import os
import signal
import textwrap

import pytest

from agents.wire.lab.model import load_lab
from tests.support.agent_process import one_machine_lab, start_agent, wait_listening
from tests.support.waits import wait_until

WRITES = 300  # asyncio logs one line per write from the 5th on, to a transport whose connection was lost


# Loaded by the agent's interpreter (sitecustomize): once the test says so (the agent is up, its logging set), a thread
# runs its own event loop with a real socket transport whose far end has closed, and writes to it WRITES times.
SITECUSTOMIZE = textwrap.dedent(f"""
    import os, threading

    def _writer():
        import asyncio, socket, time
        trigger = os.environ["CETLAB_TEST_TRIGGER"]
        deadline = time.monotonic() + 120
        while not os.path.exists(trigger) and time.monotonic() < deadline:
            time.sleep(0.05)

        async def main():
            near, far = socket.socketpair()
            transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=near)
            far.close()
            for _ in range({WRITES}):
                transport.write(b"x" * 65536)
                await asyncio.sleep(0)
            transport.abort()
            open(trigger + ".done", "w").close()

        asyncio.run(main())

    threading.Thread(target=_writer, daemon=True).start()
""")


@pytest.mark.timeout(120)
def test_the_agent_throttles_asyncios_send_warnings(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    trigger = tmp_path / "go"
    lab = one_machine_lab(tmp_path / "lab.yaml")
    machine = load_lab(lab).machine("box")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "CETLAB_TEST_TRIGGER": str(trigger)}
    proc = start_agent(lab, tmp_path / "state", env=env)
    try:
        wait_listening(machine.host, machine.port, proc)
        trigger.touch()
        wait_until(lambda: (tmp_path / "go.done").exists(), 60, what="the writes done")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    lines = [line for line in err.decode().splitlines() if "socket.send() raised exception" in line]
    # without the agent's filter: one line per write after the 5th (WRITES - 5); with it: one per 10 s
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines:\n" + "\n".join(lines[:5])
