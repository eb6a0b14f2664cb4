"""An agent finds the component behind a port once per list of components (an isinstance of a runtime-checkable
Protocol walks the Protocol's members every time), and a changed list is looked through again."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents.gateway.port import GatewayPort
from agents.shell.agent import Agent


class Spender:
    def provider_spend(self) -> list[Any]:
        return []

    def spend_by_day(self, since_day: str) -> dict[str, dict[str, float]]:
        return {}


class Other:
    pass


def test_find_answers_as_looking_through_the_components_does_and_sees_a_new_list():
    core: Any = SimpleNamespace(components=[], _found={}, _found_in=None)
    assert Agent.find(core, GatewayPort) is None  # looked up while the components are being built
    spender = Spender()
    core.components = [Other(), spender]  # the list the agent keeps
    assert Agent.find(core, GatewayPort) is spender
    assert Agent.find(core, Spender) is spender and Agent.find(core, Other) is core.components[0]
    core.components.remove(spender)
    assert Agent.find(core, GatewayPort) is None
    another = Spender()
    core.components.append(another)
    assert Agent.find(core, GatewayPort) is another
