"""An agent's stop ends: a part whose stop holds is named in the log, with the line it waits on, and the rest stop.

Before, one part that never returned (a link's connect retried forever, cpython#86296) held the agent's stop, and with
it a lab's teardown and systemd's stop, until something outside killed it.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from agents.runtime import stopping
from agents.runtime.hooks import Hooks
from agents.runtime.stopping import stop_within


class Holds(Hooks):
    """A part whose stop waits on something that never comes."""

    name = "holds"
    stop_grace_s = 0.2

    def __init__(self) -> None:
        self.cancelled = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        try:
            await asyncio.Event().wait()  # the line the log names
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    def section(self) -> None:
        return None


class Stops(Hooks):
    name = "stops"

    def __init__(self) -> None:
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def section(self) -> None:
        return None


@pytest.mark.timeout(30)
async def test_an_agents_stop_ends_past_a_part_that_holds_and_names_it(in_process, caplog):
    lab = await in_process()
    (agent,) = lab.agents.values()
    holds, stops = Holds(), Stops()
    agent.components[:0] = [stops]  # stopped last: after the one that holds
    agent.components.append(holds)  # stopped first
    caplog.set_level(logging.ERROR, logger=stopping.__name__)
    await lab.stop_agent(agent.machine.name)
    assert holds.cancelled and stops.stopped
    (message,) = [r.getMessage() for r in caplog.records if "held past" in r.getMessage()]
    assert message.startswith("stopping holds held past its 0.2 s deadline; going on without it")
    assert "in stop" in message and "Event().wait()" in message  # where it waits: the line in its stop


async def test_a_stop_that_fails_is_logged_and_counts_as_ended(caplog):
    async def fails() -> None:
        raise RuntimeError("disk gone")

    caplog.set_level(logging.ERROR, logger=stopping.__name__)
    assert await stop_within("failing", fails(), 1.0) is True
    assert any("stopping failing failed" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_stop_that_ends_in_time_is_not_cancelled():
    done = asyncio.Event()

    async def slow_but_fine() -> None:
        await asyncio.sleep(0)
        done.set()

    assert await stop_within("fine", slow_but_fine(), 5.0) is True and done.is_set()


async def test_the_parts_that_stop_processes_get_the_time_their_processes_get():
    from agents.gateway.component import GatewayComponent
    from agents.orchestra import engine, spread
    from agents.orchestra.component import OrchestraComponent
    from agents.shell.daemon import STOP_GRACE_S as DAEMON_GRACE_S

    assert OrchestraComponent.stop_grace_s > engine.STOP_GRACE_S + spread.STOP_GRACE_S  # engines, then a spread's parts
    assert GatewayComponent.stop_grace_s > stopping.DRAIN_S  # the requests in flight drain first
    assert OrchestraComponent.stop_grace_s < DAEMON_GRACE_S  # and all of it within the daemon's own deadline
