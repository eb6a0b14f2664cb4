"""A replica drains before it goes out (agents/orchestra/lifecycle.py, Lifecycle.drain).

The engine here is a stand-in whose /metrics figures the test sets (the requests it runs and queues, as vLLM's
num_requests_running/_waiting and llama-server's requests_processing/_deferred say): what matters is what the agent
does with them. The e2e test (tests/e2e/gateway/test_replicas_swap.py) drains real simulated engines under real traffic.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agents.orchestra.lifecycle import Lifecycle
from agents.orchestra.slot import Slot
from agents.runtime.waits import within
from agents.wire.lab.model import parse_lab
from agents.wire.lab.replicas import models_on
from agents.wire.states import ModelState
from tests.support.waits import wait_for

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


def lab_with(replicas: list[dict], drain_timeout_s: float = 60.0):
    data = {
        "lab": "drain-test",
        "machines": [{"name": "a", "gpus": {"sim": [P4]}, "sample_interval_s": 0.05}, {"name": "b", "gpus": {"sim": [P4]}}],
        "models": [
            {
                "name": "chat",
                "path": "models/chat",
                "engine": "sim",
                "machine": "a",
                "gpus": [0],
                "replicas": replicas,
                "drain_timeout_s": drain_timeout_s,
            }
        ],
    }
    return parse_lab(yaml.safe_dump(data, sort_keys=False))


class Engine:
    """The figures an engine's /metrics gives, as the test sets them."""

    def __init__(self, running: float | None = 0, waiting: float | None = 0):
        self.figures: dict[str, Any] = {"requests_running": running, "requests_waiting": waiting}
        self.asked = 0

    async def metrics(self) -> dict[str, Any]:
        self.asked += 1
        return {k: v for k, v in self.figures.items() if v is not None}


class Book:
    def __init__(self) -> None:
        self.notices: list[tuple[str, str]] = []
        self.events: list[tuple[str, float | None, Any]] = []

    def notice(self, level: str, text: str) -> None:
        self.notices.append((level, text))

    def event(self, slot: Slot, event: str, duration_s: float | None = None, detail: Any = None, **_: Any) -> None:
        self.events.append((event, duration_s, detail))


def pool(lab, engine: Engine) -> tuple[Lifecycle, Slot, Book]:
    book = Book()
    core = SimpleNamespace(machine=lab.machine("a"), lab=lab)
    lifecycle = Lifecycle(core, book, None, None)  # type: ignore[arg-type]  # drain asks the core and the book only
    model = models_on(lab, "a")[0]
    slot = Slot(model, Path("models/chat"), [0], state=ModelState.WARM)
    slot.engine = engine  # type: ignore[assignment]
    return lifecycle, slot, book


async def test_a_replica_drains_until_its_engine_runs_no_request_then_goes_on():
    engine = Engine(running=2, waiting=1)
    lifecycle, slot, book = pool(lab_with([{"machine": "b", "gpus": [0]}]), engine)
    drain = asyncio.create_task(lifecycle.drain(slot))
    await wait_for(lambda: slot.draining and engine.asked >= 5)
    assert not drain.done()
    engine.figures.update(requests_running=1, requests_waiting=0)
    await wait_for(lambda: engine.asked >= 10)
    assert not drain.done()
    engine.figures.update(requests_running=0)
    await within(drain, 10)
    assert slot.draining  # stays draining until the operation that took it out ends (Lifecycle._guard clears it)
    assert [e[0] for e in book.events] == ["drain"] and book.events[0][2] == {"running": 0} and not book.notices


async def test_a_replica_whose_requests_outlast_its_drain_timeout_goes_out_anyway_and_says_so():
    engine = Engine(running=3)
    lifecycle, slot, book = pool(lab_with([{"machine": "b"}], drain_timeout_s=0.3), engine)
    await within(lifecycle.drain(slot), 10)
    assert len(book.notices) == 1
    level, text = book.notices[0]
    assert level == "warning" and "3 requests still running" in text and "drain_timeout_s" in text


async def test_an_engine_that_reports_no_counts_is_drained_for_the_ticks_only():
    engine = Engine(running=None, waiting=None)
    lifecycle, slot, book = pool(lab_with([{"machine": "b"}]), engine)
    await within(lifecycle.drain(slot), 10)
    assert book.events[0][2] == {"running": None} and not book.notices


@pytest.mark.parametrize("state", [ModelState.SLEEPING, ModelState.COLD])
async def test_nothing_drains_that_does_not_serve_or_has_no_replicas(state):
    engine = Engine(running=5)
    lifecycle, slot, book = pool(lab_with([{"machine": "b"}]), engine)
    slot.state = state
    await within(lifecycle.drain(slot), 10)
    lifecycle, single, book = pool(lab_with([]), engine)
    await within(lifecycle.drain(single), 10)
    assert engine.asked == 0 and not book.events and not slot.draining and not single.draining
