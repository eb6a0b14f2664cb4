"""A component that starts failing is visible (issue 22 item 7): its section shows as failed, with the error, on the
console's view of it, the fleet card, the header, `cetlab status` and its JSON, and it recovers when the component does."""

from __future__ import annotations

import json
import logging

from agents.runtime.hooks import Hooks
from agents.runtime.rpc import Peer
from agents.shell.agent import Agent
from agents.wire.lab.model import parse_lab
from agents.wire.protocol import EVENT_TICK, Role
from agents.wire.sections.base import FaultsSection


async def test_a_component_raising_in_its_update_is_a_fault_pushed_once_logged_once_and_cleared(tmp_path, caplog):
    lab = parse_lab("lab: t\nmachines: [{name: box, gpus: {sim: [{name: Tesla P4, memory_gib: 8, tdp_w: 75}]}}]\n")

    class Counter(Hooks):
        name = "counter"
        broken = False

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        def on_telemetry(self, telemetry) -> None:
            if self.broken:
                raise OSError("disk read failed")

        def section(self) -> dict:
            return {"n": 1}

    counter = Counter()
    agent = Agent(lab, "box", tmp_path, components=lambda core: [counter])
    sent: list[dict] = []
    agent.peers.add(Peer(role=Role.VIEWER, who="test", send=lambda line: sent.append(json.loads(line)), topics={EVENT_TICK}))

    def pushed_faults() -> list[FaultsSection]:
        return [FaultsSection.model_validate(m["data"]["changed"]["faults"]) for m in sent if "faults" in m["data"]["changed"]]

    agent.tick()
    assert pushed_faults() == [FaultsSection()]  # the first tick pushes every section: none failing
    counter.broken = True
    with caplog.at_level(logging.ERROR, logger="cetlab.agent"):
        for _ in range(3):
            agent.tick()
    assert len(pushed_faults()) == 2  # pushed when it starts failing, not again while it goes on failing the same way
    (fault,) = pushed_faults()[-1].failed
    assert (fault.section, fault.phase, fault.error) == ("counter", "update", "OSError: disk read failed")
    assert len([r for r in caplog.records if "counter failed" in r.getMessage()]) == 1
    counter.broken = False
    agent.tick()
    assert pushed_faults()[-1] == FaultsSection()
