"""Which replica of a model the gateway sends a request to (agents/gateway/replicas.py), and lab.yaml's replicas.

The gateway's reach is a stand-in here: each machine's view is what its agent's last tick said, set by the test, and
its links are online or not as the test says. The requests themselves, the agents and their engines are the e2e test's
(tests/e2e/gateway/test_replicas_swap.py); this one checks the choice, case by case, exactly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from agents.gateway.metering import Meter
from agents.gateway.replicas import AFFINITY_SLACK, choose, conversation_key, replica_figures
from agents.gateway.router import Router
from agents.orchestra.engines import engine_spec
from agents.runtime.reach import Unreachable
from agents.runtime.store import Store
from agents.runtime.view import LabView
from agents.wire.lab.model import LabError, parse_lab
from agents.wire.lab.replicas import models_on, placements
from agents.wire.protocol import LinkStatus

P4 = {"name": "Tesla P4", "memory_gib": 8, "tdp_w": 75}


LAB = {
    "lab": "replicas-test",
    "machines": [
        {"name": "hub", "gpus": {"sim": [P4]}},
        {"name": "a", "gpus": {"sim": [P4, P4]}},
        {"name": "b", "gpus": {"sim": [P4]}},
    ],
    "models": [
        {
            "name": "chat",
            "path": "models/chat",
            "engine": "sim",
            "machine": "a",
            "gpus": [1],
            "vram_gib": 1,
            "replicas": [{"machine": "b", "gpus": [0]}],
        }
    ],
    "gateway": {"machine": "hub"},
}


@dataclass
class Link:
    status: LinkStatus = LinkStatus.ONLINE
    online: asyncio.Event = field(default_factory=asyncio.Event)


def info(machine: str, state: str = "warm", **fields: Any) -> dict[str, Any]:
    endpoint = f"unix:/run/{machine}/chat.sock" if state == "warm" else None
    return {"name": "chat", "machine": machine, "engine": "sim", "since": 0.0, "state": state, "endpoint": endpoint, **fields}


class Reach:
    """The gateway's reach over the lab's machines: their last ticks as the test sets them, links up or down."""

    def __init__(self, lab):
        self.views = LabView(lab)
        self.down: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def tick(self, *models: dict[str, Any]) -> None:
        for model in models:
            self.views.apply_tick(model["machine"], {"t": 0.0, "changed": {"models": {"models": [model]}}})

    def view(self, machine: str):
        return self.views.machines.get(machine)

    def all_views(self):
        return self.views.machines.items()

    def apply_models(self, machine: str, listing) -> None:
        self.views.apply_models(machine, listing)

    async def reachable(self, machine: str) -> None:
        if machine in self.down:
            raise Unreachable(machine, "offline", None, "start its agent")

    async def tunnel(self, machine: str, address) -> str:
        return f"/tmp/tunnel-{machine}.sock"

    async def call(self, machine: str, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        self.calls.append((machine, method))
        if method == "models.list":
            view = self.views.machines[machine]
            return {"machine": machine, "models": [m.model_dump(mode="json") for m in view.model_list]}
        raise AssertionError(f"unexpected call {method} to {machine}")


@pytest.fixture
def lab():
    return parse_lab(yaml.safe_dump(LAB, sort_keys=False))


@pytest.fixture
def reach(lab):
    return Reach(lab)


@pytest.fixture
def router(lab, reach, tmp_path):
    return Router(lab, "hub", reach, Meter(Store(tmp_path / "state.db"), None), engine_spec)


async def where(router: Router, conversation: str | None = None, avoid: frozenset[str] = frozenset()) -> str:
    return (await router.route("chat", None, conversation, avoid)).where


def test_each_machine_runs_its_placement_of_the_model(lab):
    on_a, on_b = models_on(lab, "a"), models_on(lab, "b")
    assert [(m.name, m.machine, m.gpus) for m in on_a] == [("chat", "a", [1])]
    assert [(m.name, m.machine, m.gpus) for m in on_b] == [("chat", "b", [0])]
    assert models_on(lab, "hub") == [] and [p.machine for p in placements(lab.models[0])] == ["a", "b"]


@pytest.mark.parametrize(
    ("replicas", "problem"),
    [
        ([{"machine": "nowhere"}], "models[0].replicas[0].machine: no machine named 'nowhere'"),
        ([{"machine": "a", "gpus": [0]}], "models[0].replicas[0].machine: chat already has a placement on a: one per machine"),
        ([{"machine": "b"}, {"machine": "b"}], "models[0].replicas[1].machine: chat already has a placement on b"),
        ([{"machine": "b", "gpus": [3]}], "models[0].replicas[0].gpus[0]: machine b has 1 GPU (0..0), no GPU 3"),
        ([{"machine": "b", "cpus": 2}], "models[0].replicas[0].cpus"),
    ],
)
def test_a_replica_lab_yaml_cannot_run_is_refused_naming_its_line(replicas, problem):
    data = {**LAB, "models": [{**LAB["models"][0], "replicas": replicas}]}
    with pytest.raises(LabError) as caught:
        parse_lab(yaml.safe_dump(data, sort_keys=False))
    assert problem in str(caught.value) and str(caught.value).startswith("lab.yaml:")


async def test_a_request_goes_to_the_replica_with_the_fewest_outstanding(router, reach):
    reach.tick(info("a"), info("b"))
    router.outstanding[("chat", "a")] = 3
    assert await where(router) == "b"
    router.outstanding[("chat", "b")] = 5
    assert await where(router) == "a"


async def test_equally_busy_replicas_take_turns(router, reach):
    reach.tick(info("a"), info("b"))
    chosen = [await where(router) for _ in range(4)]
    assert sorted(chosen[:2]) == ["a", "b"] and chosen[2:] == chosen[:2]


async def test_a_conversation_stays_on_its_replica_until_that_is_much_busier(router, reach):
    reach.tick(info("a"), info("b"))
    first = conversation_key({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]})
    later = conversation_key(
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and now?"},
            ]
        }
    )
    assert first is not None and first == later  # the same conversation, two turns on
    home = await where(router, first)
    other = "b" if home == "a" else "a"
    router.outstanding[("chat", home)] = AFFINITY_SLACK  # busier, but not by more than the slack
    assert await where(router, later) == home
    router.outstanding[("chat", home)] = AFFINITY_SLACK + 1
    assert await where(router, later) == other  # too busy: it moves, and stays on its new replica
    router.outstanding[("chat", home)] = 0
    assert await where(router, later) == other
    stranger = conversation_key({"messages": [{"role": "user", "content": "something else"}]})
    assert stranger != first


def test_a_conversation_without_a_system_prompt_keeps_its_key_turn_after_turn():
    turn = [{"role": "user", "content": "hi"}]
    keys = set()
    for reply in ("hello", "sure", "bye"):
        keys.add(conversation_key({"messages": turn}))
        turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": f"after {reply}"}]
    assert len(keys) == 1 and None not in keys
    assert conversation_key({"prompt": "Once upon a time"}) == conversation_key({"prompt": "Once upon a time"})
    assert conversation_key({"messages": []}) is None and conversation_key({"input": "x"}) is None


async def test_a_draining_replica_gets_no_request_not_even_its_conversations(router, reach):
    reach.tick(info("a"), info("b"))
    key = conversation_key({"messages": [{"role": "user", "content": "hi"}]})
    home = await where(router, key)
    other = "b" if home == "a" else "a"
    reach.tick(info(home, draining=True, op="swap"))
    router.outstanding[("chat", other)] = 10
    assert {await where(router, key) for _ in range(5)} == {other}
    reach.tick(info(home, state="sleeping"))  # out now; the other still serves: no wake for it
    assert {await where(router, key) for _ in range(5)} == {other}
    assert not any(method == "models.warm" for _, method in reach.calls)


async def test_a_replica_with_an_operation_in_flight_or_failed_or_unreachable_is_passed_over(router, reach):
    reach.tick(info("a", op="sleep"), info("b"))
    assert await where(router) == "b"
    reach.tick(info("a", op="cache"), info("b"))  # reading its files into the page cache: it still serves
    router.outstanding[("chat", "b")] = 1
    assert await where(router) == "a"
    router.outstanding.clear()
    reach.tick(info("a"), info("b", state="failed"))
    assert await where(router) == "a"
    reach.tick(info("b"))
    reach.down.add("a")
    assert {await where(router) for _ in range(3)} == {"b"}


async def test_a_retry_goes_to_another_replica_and_to_the_same_when_none_other_serves(router, reach):
    reach.tick(info("a"), info("b"))
    assert await where(router, avoid=frozenset({"a"})) == "b"
    assert await where(router, avoid=frozenset({"b"})) == "a"
    reach.tick(info("b", state="failed"))
    assert await where(router, avoid=frozenset({"a"})) == "a"


async def test_with_none_warm_the_quickest_to_bring_up_is_woken(router, reach):
    reach.tick(info("a", state="cold", load_s=5.0), info("b", state="sleeping", wake_s=0.5))
    chosen = router.local["chat"]
    assert (await choose(router, chosen, None, frozenset())).machine == "b"
    reach.tick(info("b", state="sleeping", wake_s=0.5, draining=True))
    assert (await choose(router, chosen, None, frozenset())).machine == "a"


async def test_the_gateway_section_shows_each_replica(router, reach):
    reach.tick(info("a"), info("b", draining=True))
    router.outstanding[("chat", "a")] = 2
    figures = replica_figures(router, router.local["chat"])
    assert [(r.machine, r.gpus, r.state, r.draining, r.outstanding) for r in figures] == [
        ("a", [1], "warm", False, 2),
        ("b", [0], "warm", True, 0),
    ]


async def test_the_gateway_lists_a_replicated_model_where_it_serves_not_at_its_first_entry(router, reach):
    from types import SimpleNamespace

    from agents.gateway.component import GatewayComponent

    gateway = SimpleNamespace(router=router, config=router.gateway, created=0, engine_spec=engine_spec, lab=router.lab)
    reach.tick(info("a", state="cached"), info("b"))  # the first entry's placement was swapped out; b's serves
    (entry,) = [e for e in GatewayComponent.catalogue(gateway) if e["id"] == "chat"]  # type: ignore[arg-type]
    assert (entry["state"], entry["machine"]) == ("warm", "b")
    reach.tick(info("a"))
    (entry,) = [e for e in GatewayComponent.catalogue(gateway) if e["id"] == "chat"]  # type: ignore[arg-type]
    assert (entry["state"], entry["machine"]) == ("warm", "a,b")
