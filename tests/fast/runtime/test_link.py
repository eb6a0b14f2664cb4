"""The one client core (agents/runtime/link.py): its state machine, pending table, read loop and typed views.

The agent's side here is a scripted JSON-lines peer over a real socket pair: the core does not care how the
bytes travel (SSH, a machine's sshd or OpenSSH are the openers', tested with real agents elsewhere), and a
script can answer as no healthy agent would (silence, a dropped connection, another machine's name).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import yaml

from agents.runtime.link import Link, LinkCore, LinkSettings, Transport
from agents.runtime.view import GPU_SERIES, LabView
from agents.wire.catalogue.method import ReplyInvalid
from agents.wire.events import Notice, PushEvent
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import PROTOCOL_VERSION, ErrorCode, LinkStatus, RemoteError, encode
from agents.wire.states import ModelState
from console.lab.openssh import PipeReader
from console.lab.state import LabState
from console.lab.status import status_human, status_json
from tests.support.waits import wait_for
from widgets.section_faults import fault_line

LAB = parse_lab(yaml.safe_dump({"lab": "link-test", "machines": [{"name": "box", "gpus": {"sim": []}}]}))


# (method, params, reply writer) -> None: answers one request, or does not
Script = Callable[[str, dict[str, Any], Callable[[dict[str, Any]], None]], Awaitable[None]]


def hello(machine: str = "box") -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "agent_version": "test",
        "machine": machine,
        "lab": "link-test",
        "role": "operator",
        "capabilities": [],
        "simulated": True,
        "sample_interval_s": 1.0,
        "started_at": 0.0,
    }


def model(name: str, state: str) -> dict[str, Any]:
    return {"name": name, "machine": "box", "engine": "sim", "state": state, "since": 0.0}


class ScriptedAgent:
    """Opens each attempt as a socket pair whose far end answers as ``script`` says."""

    def __init__(self, script: Script):
        self.script = script
        self.opened = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def open(self, link: Link) -> Transport:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        far_reader, far_writer = await asyncio.open_unix_connection(sock=theirs)
        self.opened += 1
        self.writers.append(far_writer)
        serving = asyncio.create_task(self._serve(far_reader, far_writer))

        async def close() -> None:
            writer.close()
            serving.cancel()
            far_writer.close()

        return Transport(PipeReader(reader), writer, close)

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        def send(message: dict[str, Any]) -> None:
            writer.write(encode(message))

        while line := await reader.readline():
            request = json.loads(line)

            def reply(result: dict[str, Any], request_id: int = request["id"]) -> None:
                send({"id": request_id, **result})

            await self.script(request["method"], request["params"], reply)

    def push(self, event: str, data: Any) -> None:
        """An event from the agent on its newest connection."""
        self.writers[-1].write(encode({"event": event, "data": data}))


@asynccontextmanager
async def linked(script: Script, view: LabView | None = None, **options: Any) -> AsyncIterator[tuple[ScriptedAgent, LinkCore]]:
    """A core linked to a scripted agent, past its first attempt; stopped on the way out."""
    agent = ScriptedAgent(script)
    settings = LinkSettings(
        **{
            "topics": ["tick"],
            "call_timeout_s": 5.0,
            "connect_timeout_s": 5.0,
            "keepalive_s": 30.0,
            "backoff_max_s": 0.2,
            **options,
        }
    )
    core = LinkCore(LAB.machines, agent, view or LabView(LAB), settings)
    core.start()
    try:
        await core.wait_connected(10)
        yield agent, core
    finally:
        await core.stop()


async def answers(method: str, params: dict[str, Any], reply: Callable[[dict[str, Any]], None], machine: str = "box") -> None:
    """A healthy agent's answers to what the core asks on connecting."""
    if method == "hello":
        reply({"result": hello(machine)})
    elif method == "subscribe":
        reply({"result": {"topics": params["topics"]}})


async def test_ticks_enter_the_view_typed_and_a_section_that_does_not_fit_is_named():
    async with linked(answers) as (agent, core):
        view = core.view.machines["box"]
        assert core.links["box"].status is LinkStatus.ONLINE and view.link is LinkStatus.ONLINE
        agent.push("tick", {"t": 1.0, "full": True, "changed": {"models": {"models": [model("llm", "sleeping")]}}})
        info = await wait_for(lambda: view.model("llm"))
        assert info.state is ModelState.SLEEPING and view.sample_t == 1.0
        agent.push("tick", {"t": 2.0, "changed": {"models": {"models": [model("llm", "dozing")]}}})
        await wait_for(lambda: "models" in view.problems)
        assert "models.models.0.state" in view.problems["models"]
        assert view.model("llm").state is ModelState.SLEEPING  # the last value that fitted stays


async def test_a_call_pending_when_the_link_drops_fails_disconnected_and_the_link_comes_back():
    async def script(method: str, params: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        if method == "jobs.list":  # the connection ends instead of an answer
            agent.writers[-1].close()
        else:
            await answers(method, params, reply)

    async with linked(script) as (agent, core):
        with pytest.raises(RemoteError) as raised:
            await core.call("box", "jobs.list")
        assert raised.value.code is ErrorCode.DISCONNECTED
        await wait_for(lambda: agent.opened == 2 and core.links["box"].status is LinkStatus.ONLINE)
        assert core.view.machines["box"].link is LinkStatus.ONLINE


async def test_an_unanswered_call_times_out_typed_and_an_unknown_machine_is_not_found():
    async with linked(answers) as (_agent, core):  # answers hello and subscribe only
        with pytest.raises(RemoteError) as raised:
            await core.call("box", "models.list", timeout=0.2)
        assert raised.value.code is ErrorCode.TIMEOUT and "models.list" in raised.value.message
        assert not core.links["box"].pending
        with pytest.raises(RemoteError) as raised:
            await core.call("nowhere", "hello")
        assert raised.value.code is ErrorCode.NOT_FOUND


async def test_an_agent_that_answers_as_another_machine_is_refused_with_the_reason():
    async def script(method: str, params: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        await answers(method, params, reply, machine="impostor")

    async with linked(script, reconnect=False) as (agent, core):
        link = core.links["box"]
        assert link.status is LinkStatus.OFFLINE and "answers as machine 'impostor'" in (link.error or "")
        with pytest.raises(RemoteError) as raised:
            await core.call("box", "status")
        assert raised.value.code is ErrorCode.DISCONNECTED and "impostor" in raised.value.message


async def test_a_reply_that_does_not_fit_its_method_is_a_typed_error_naming_the_field_and_the_link_stays():
    async def script(method: str, params: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        if method == "models.list":
            reply({"result": {"machine": "box", "models": [model("llm", "dozing")]}})
        else:
            await answers(method, params, reply)

    async with linked(script) as (agent, core):
        with pytest.raises(ReplyInvalid) as raised:
            await core.call("box", "models.list")
        assert raised.value.method == "models.list" and raised.value.field == "models.0.state"
        assert isinstance(raised.value, RemoteError) and "dozing" in raised.value.message
        assert core.links["box"].status is LinkStatus.ONLINE and agent.opened == 1


async def test_an_event_that_does_not_validate_is_dropped_and_logged_once_naming_it_and_the_link_stays(caplog):
    seen: list[tuple[str, PushEvent]] = []
    async with linked(answers) as (agent, core):
        core.on_event = lambda machine, name, event: seen.append((name, event))
        with caplog.at_level(logging.WARNING, logger="cetlab.link"):
            agent.push("notice", {"level": "loud", "message": "not a level"})
            agent.push("notice", {"level": "loud", "message": "the same fault again: dropped without a second line"})
            agent.push("log", {"job": "box-1", "lines": "one line, not a list", "offset": 3})
            agent.push("tick", {"t": "soon", "changed": {}})
            agent.push("gossip", {"anything": 1})  # an event this client does not know
            agent.push("notice", {"level": "warning", "message": "gpu0 is hot", "alert": None})
            await wait_for(lambda: seen)
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 4, dropped  # once per event and field
        assert any("'notice': level" in m for m in dropped) and any("'log': lines" in m for m in dropped), dropped
        assert any("'tick': t" in m for m in dropped) and any("'gossip'" in m for m in dropped), dropped
        assert seen == [("notice", Notice(level="warning", message="gpu0 is hot"))]  # only what validated, typed
        assert isinstance(seen[0][1], Notice) and seen[0][1].level == "warning"
        assert core.links["box"].status is LinkStatus.ONLINE and agent.opened == 1  # the read loop went on
        assert core.view.machines["box"].sample_t is None  # the tick that did not fit never reached the view


def replying(method_name: str, result: Any) -> Script:
    """A healthy agent that also answers ``method_name`` with ``result``."""

    async def script(method: str, params: dict[str, Any], reply: Callable[[dict[str, Any]], None]) -> None:
        if method == method_name:
            reply({"result": result})
        else:
            await answers(method, params, reply)

    return script


async def test_a_line_nested_deeper_than_python_parses_is_dropped_and_logged_and_the_link_goes_on(caplog):
    async with linked(replying("jobs.list", [])) as (agent, core):
        view = core.view.machines["box"]
        with caplog.at_level(logging.WARNING, logger="cetlab.link"):
            agent.writers[-1].write(b'{"event": "tick", "data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
            agent.push("tick", {"t": 5.0, "full": True, "changed": {}})
            await wait_for(lambda: view.sample_t == 5.0)  # the line after it was read
        assert any("box sent a line that is not JSON" in r.getMessage() and "recursion" in r.getMessage() for r in caplog.records)
        assert core.links["box"].status is LinkStatus.ONLINE and view.link is LinkStatus.ONLINE and agent.opened == 1
        assert await core.call("box", "jobs.list") == []  # calls are still answered


async def test_an_event_handler_that_raises_is_logged_once_and_the_link_goes_on(caplog):
    handled: list[float] = []

    def handler(machine: str, name: str, event: PushEvent) -> None:
        handled.append(getattr(event, "t", 0.0))
        raise ValueError("the screen's bug")

    async with linked(answers) as (agent, core):
        core.on_event = handler
        with caplog.at_level(logging.ERROR, logger="cetlab.link"):
            for t in (1.0, 2.0, 3.0):
                agent.push("tick", {"t": t, "changed": {}})
            await wait_for(lambda: len(handled) == 3)
        assert len([r for r in caplog.records if "handler of its 'tick' event failed" in r.getMessage()]) == 1
        assert core.links["box"].status is LinkStatus.ONLINE and agent.opened == 1
        assert core.view.machines["box"].sample_t == 3.0


async def test_any_other_failure_in_the_read_loop_marks_the_link_offline_with_why_and_it_reconnects():
    async with linked(answers) as (agent, core):
        seen: list[tuple[LinkStatus, str | None]] = []
        set_status = core.set_status

        def recording(link: Link, status: LinkStatus, error: str | None = None) -> None:
            seen.append((status, error))
            set_status(link, status, error)

        core.set_status = recording  # type: ignore[method-assign]  # records each change, then makes it
        apply_tick = core.view.apply_tick

        def fails_once(name: str, tick: Any) -> None:
            core.view.apply_tick = apply_tick  # type: ignore[method-assign]  # only the first tick fails
            raise RuntimeError("a bug in the view")

        core.view.apply_tick = fails_once  # type: ignore[method-assign]  # a bug past the parsing
        agent.push("tick", {"t": 1.0, "changed": {}})
        await wait_for(lambda: agent.opened == 2 and core.links["box"].status is LinkStatus.ONLINE)
        assert (LinkStatus.OFFLINE, "the link failed unexpectedly: a bug in the view") in seen
        assert core.view.machines["box"].link is LinkStatus.ONLINE


def gpu(index: int) -> dict[str, Any]:
    return {"index": index, "name": "sim", "util_pct": 5.0}


async def test_a_tick_with_thousands_of_gpus_is_refused_and_the_series_keep_to_the_latest_full_tick():
    async with linked(answers) as (agent, core):
        view = core.view.machines["box"]
        agent.push("tick", {"t": 1.0, "full": True, "changed": {"gpus": [gpu(0), gpu(1)]}})
        await wait_for(lambda: view.sample_t == 1.0)
        assert sorted(view.gpus) == [0, 1] and "gpu1.util_pct" in view.series
        agent.push("tick", {"t": 2.0, "changed": {"gpus": [gpu(i) for i in range(2, 5002)]}})  # 5,000 new GPUs a tick
        await wait_for(lambda: view.sample_t == 2.0)
        assert "gpus" in view.problems and "at most 64" in view.problems["gpus"], view.problems
        agent.push("tick", {"t": 3.0, "changed": {"gpus": [gpu(64)]}})  # one GPU past the bound
        await wait_for(lambda: view.sample_t == 3.0)
        assert "gpus.0.index" in view.problems["gpus"] and sorted(view.gpus) == [0, 1]
        agent.push("tick", {"t": 4.0, "full": True, "changed": {"gpus": [gpu(0)]}})  # gpu1 is gone
        await wait_for(lambda: view.sample_t == 4.0)
        assert sorted(view.gpus) == [0] and not view.problems
        assert sorted(view.series) == ["cpu_pct", *sorted(f"gpu0.{key}" for key in GPU_SERIES)]
        assert core.links["box"].status is LinkStatus.ONLINE


async def test_a_section_refused_as_sent_is_shown_as_a_failing_one_until_a_valid_one_arrives():
    state = LabState(LAB)
    async with linked(answers, view=state) as (agent, core):
        agent.push("tick", {"t": 1.0, "full": True, "changed": {"models": {"models": [model("llm", "sleeping")]}}})
        await wait_for(lambda: state.machines["box"].model("llm"))
        assert state.faults() == [] and status_json(state)["machines"][0]["sections_failed"] == []
        agent.push("tick", {"t": 2.0, "changed": {"models": {"models": [model("llm", "dozing")]}}})
        await wait_for(lambda: state.faults())
        [(machine, fault)] = state.faults(["models"])
        assert machine == "box" and fault.section == "models" and fault.phase == "refused"
        assert "box sent a models section that does not fit: models.models.0.state" in fault.error
        assert "REFUSED" in fault_line(machine, fault).plain and "models.models.0.state" in fault_line(machine, fault).plain
        [failed] = status_json(state)["machines"][0]["sections_failed"]  # `cetlab --json status`
        assert failed["section"] == "models" and failed["phase"] == "refused" and "models.0.state" in failed["error"]
        assert "section models FAILED (refused)" in status_human(status_json(state))
        assert state.faults(["jobs"]) == []  # only the views showing models
        agent.push("tick", {"t": 3.0, "changed": {"models": {"models": [model("llm", "warm")]}}})
        await wait_for(lambda: not state.faults())
        assert status_json(state)["machines"][0]["sections_failed"] == []


async def test_a_reply_that_does_not_fit_names_the_machine_and_the_cli_says_bad_reply_not_offline():
    from agents.wire.catalogue.method import request
    from agents.wire.catalogue.models import MODELS_LIST
    from console.cli.checkpoints import runs_human
    from console.cli.models import models_human

    script = replying("models.list", {"machine": "box", "models": [model("llm", "dozing")]})
    async with linked(script) as (_agent, core):
        with pytest.raises(ReplyInvalid) as raised:
            await core.call("box", "models.list")
        assert raised.value.message.startswith("box answered models.list with a reply that does not fit at models.0.state: ")
        with pytest.raises(ReplyInvalid) as typed:
            await request(core, "box", MODELS_LIST)
        assert raised.value.code is ErrorCode.INVALID_REPLY and typed.value.machine == "box"
        assert "box answered models.list" in typed.value.message
        down = RemoteError(ErrorCode.DISCONNECTED, "gpu2 is offline")
        for lines in (
            models_human([], {}, {"box": typed.value, "gpu2": down}),
            runs_human([], {"box": typed.value, "gpu2": down}),
        ):
            assert "box: bad reply box answered models.list with a reply that does not fit" in lines
            assert "box: OFFLINE" not in lines and "gpu2: OFFLINE gpu2 is offline" in lines
