"""The gateway router's wake decision when its view is a tick behind the agent (a race seen in CI under load).

The peer here is a stand-in that answers the way an agent does: the last tick still says the model is warm and
going to sleep, a fresh `models.list` says it is asleep now. The race cannot be timed reliably against real agents
(it needs the request to land between the agent's sleep and its next tick), so this test builds it exactly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from agents.gateway.metering import Meter
from agents.gateway.router import Router
from agents.gateway.target import NotServable
from agents.orchestra.engines import engine_spec
from agents.runtime.store import Store
from agents.runtime.view import LabView
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import LinkStatus
from agents.wire.states import ModelState
from tests.support.gateway import P4

LAB = {
    "lab": "router-test",
    "machines": [{"name": "hub", "gpus": {"sim": [P4]}}],
    "models": [{"name": "sleepy", "path": "models/sleepy", "engine": "sim", "machine": "hub", "gpus": [0], "vram_gib": 1}],
    "gateway": {"machine": "hub"},
}


@dataclass
class Link:
    status: LinkStatus = LinkStatus.ONLINE
    online: asyncio.Event = field(default_factory=asyncio.Event)


def model(**fields: Any) -> dict[str, Any]:
    return {"machine": "hub", "engine": "sim", "since": 0.0, "gpus": [0], **fields}


class AgentStandIn:
    """The gateway's reach (views, call) over one model whose real state moves on as an agent's would."""

    def __init__(self, lab, tick_view: dict[str, Any], truth: dict[str, Any]):
        self.links = {"hub": Link()}
        self.views = LabView(lab)
        self.views.apply_tick("hub", {"t": 0.0, "changed": {"models": {"models": [tick_view]}}})  # the last tick, typed
        self.truth = truth
        self.calls: list[str] = []

    def view(self, machine: str):
        return self.views.machines.get(machine)

    def all_views(self):
        return self.views.machines.items()

    def apply_models(self, machine: str, listing) -> None:
        self.views.apply_models(machine, listing)

    async def reachable(self, machine: str) -> None:
        pass

    async def call(self, machine: str, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        self.calls.append(method)
        if method == "models.list":
            listing = {"machine": "hub", "models": [dict(self.truth)]}
            if self.truth.get("op") == "wake":  # the wake ends between two listings
                self.truth.update(state="warm", op=None, endpoint="http://127.0.0.1:1/v1")
            return listing
        if method == "models.warm":
            if self.truth["state"] == "warm" or self.truth.get("op"):
                raise AssertionError(f"models.warm sent while the agent says {self.truth}")
            self.truth.update(state="loading", op="wake")
            return dict(self.truth)  # what the agent answers: the model as it is now (the router checks the reply)
        raise AssertionError(f"unexpected call {method}")


def stand_in(tick_view: dict[str, Any], truth: dict[str, Any]) -> AgentStandIn:
    return AgentStandIn(parse_lab(yaml.safe_dump(LAB)), model(**tick_view), model(**truth))


def router_for(peers: AgentStandIn, tmp_path) -> Router:
    return Router(peers.views.lab, "hub", peers, Meter(Store(tmp_path / "state.db"), None), engine_spec)


async def test_a_model_that_fell_asleep_since_the_last_tick_is_woken_not_refused(tmp_path):
    peers = stand_in(
        tick_view={"name": "sleepy", "state": "warm", "op": "sleep"}, truth={"name": "sleepy", "state": "sleeping", "op": None}
    )
    router = router_for(peers, tmp_path)
    info = await router.ensure_warm(router.local["sleepy"], timeout_s=10)
    assert info.state is ModelState.WARM and info.endpoint
    assert peers.calls.count("models.warm") == 1 and router.meter.stats("sleepy").wakes == 1


async def test_a_model_put_back_to_sleep_after_its_wake_is_refused_with_the_reason(tmp_path):
    peers = stand_in(
        tick_view={"name": "sleepy", "state": "sleeping", "op": None}, truth={"name": "sleepy", "state": "sleeping", "op": None}
    )
    original = peers.call

    async def call(machine: str, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        answer = await original(machine, method, params)
        if method == "models.warm":  # someone else's sleep lands right after our wake is accepted
            peers.truth.update(state="sleeping", op=None)
        return answer

    peers.call = call
    router = router_for(peers, tmp_path)
    with pytest.raises(NotServable, match="went back to sleeping"):
        await router.ensure_warm(router.local["sleepy"], timeout_s=10)
    assert peers.calls.count("models.warm") == 1
