"""The fast tier's seam (agents/runtime/memory.py, tests/support/inprocess.py): a real agent and the console's real client in one
event loop, the same hello, dispatch and events as over SSH, and the same limits on what crosses."""

from __future__ import annotations

import time

from agents.runtime.link import Link
from agents.runtime.memory import MemoryOpener
from agents.wire.lab.machines import Machine
from agents.wire.protocol import MAX_MESSAGE_BYTES, ErrorCode, LinkStatus, RemoteError, Role
from tests.support.lab_view import SIZE, card_text, header_of
from tests.support.waits import until_drawn, wait_for

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


WITH_GHOST = {
    "lab": "test-lab",
    "machines": [{"name": "box", "gpus": {"sim": [P4]}}, {"name": "ghost", "host": "127.0.0.1", "port": 9, "gpus": "none"}],
}


async def test_a_client_links_says_hello_subscribes_and_gets_ticks(in_process):
    lab = await in_process()
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    view = client.state.machines["box"]
    assert view.link is LinkStatus.ONLINE and view.hello is not None and view.hello.machine == "box"
    await wait_for(lambda: view.gpus and view.sample_t is not None)
    assert (await client.call("box", "ping")) is not None
    assert [p.who for p in lab.agents["box"].peers] == ["test console"]


async def test_the_callers_role_is_the_agents_to_check(in_process):
    lab = await in_process()
    viewer = lab.client(Role.VIEWER, who="a viewer")
    await viewer.start()
    await viewer.wait_connected(10)
    try:
        await viewer.call("box", "set_interval", {"interval_s": 2.0})
    except RemoteError as exc:
        assert exc.code == ErrorCode.FORBIDDEN and "operator" in exc.message
    else:
        raise AssertionError("a viewer changed the sampling interval")


async def test_a_line_longer_than_a_message_may_be_is_refused_whole_and_the_link_goes_on(in_process):
    lab = await in_process()
    client = lab.client()
    await client.start()
    await client.wait_connected(10)
    link = client.links["box"]
    assert link.transport is not None
    link.transport.writer.write(b'{"id": 999, "method": "ping", "params": {"x": "' + b"x" * MAX_MESSAGE_BYTES + b'"}}\n')
    assert (await client.call("box", "ping")) is not None  # the oversized line was dropped, the next one answered
    assert link.status is LinkStatus.ONLINE


async def test_a_client_that_stops_reading_is_paused_then_read_again():
    """The agent's channel sees its write buffer grow while the client does not read, as over a socket."""
    seen: list[str] = []

    class Side:
        def open(self) -> None: ...
        def feed(self, data: bytes) -> None: ...
        def pause(self) -> None:
            seen.append("pause")

        def resume(self) -> None:
            seen.append("resume")

        def end_of_requests(self) -> None: ...
        def close(self) -> None:
            seen.append("close")

    opener = MemoryOpener(lambda machine, pipe: Side())
    transport = await opener.open(Link(Machine(name="box")))
    pipe = opener.pipes[0]
    pipe.set_write_buffer_limits(high=100)
    pipe.write(b"x" * 200 + b"\n")
    assert seen == ["pause"] and pipe.get_write_buffer_size() == 201
    assert await transport.reader.readline() == b"x" * 200 + b"\n"
    assert seen == ["pause", "resume"]
    await transport.close()
    assert await transport.reader.readline() == b""
    await wait_for(lambda: seen[-1:] == ["close"])


async def test_an_offline_machine_is_counted_in_the_header_as_its_card_shows_it(in_process):
    lab = await in_process(WITH_GHOST, machines=["box"])
    app = lab.app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.state.machines["box"].online and app.state.machines["ghost"].link == "offline")
        await wait_for(lambda: app.state.machines["box"].costs is not None)  # its notes once made the header shorten the count
        await until_drawn(pilot)
        assert "OFFLINE" in card_text(app, "ghost") and "last seen never" in card_text(app, "ghost")
        assert "connection refused" in card_text(app, "ghost") and "online" in card_text(app, "box")
        await wait_for(lambda: "1/2 machines online" in header_of(app))
        await lab.stop_agent("box")  # the machine that was online goes away: the card says so, with when it was last seen
        await wait_for(lambda: app.state.machines["box"].link == "offline")
        await until_drawn(pilot)
        assert "OFFLINE" in card_text(app, "box")
        assert time.strftime("%H:%M", time.localtime(app.state.machines["box"].last_seen)) in card_text(app, "box")
        await wait_for(lambda: "0/2 machines online" in header_of(app))


def test_the_tiers_are_read_from_what_a_test_runs(request):
    """The e2e marker follows the code (tests/conftest.py): a fixture that starts an agent process or a demo lab marks
    the tests using it end-to-end; the in-process lab does not."""
    from tests import conftest
    from tests.support.lab import kill_jobs_left, run_agent
    from tests.support.waits import wait_for

    assert request.node.get_closest_marker("e2e") is None
    assert conftest._starts_processes(run_agent) and conftest._starts_processes(conftest.small_demo.__wrapped__)
    assert conftest._starts_processes(kill_jobs_left) is False and not conftest._starts_processes(wait_for)
    assert not conftest._starts_processes(conftest.in_process.__wrapped__)
