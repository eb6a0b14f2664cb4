"""The fast tier's lab: real agents and a real console client in the test's event loop, joined by in-memory pipes.

Each agent is the real ``Agent`` (its components, its store, its sampler and its 1 Hz loop, its channel's limits);
each client is the real ``FleetClient`` on the one client core (hello check, subscribe, read loop, view). Only the
transport differs (agents/runtime/memory.py): no SSH, no process, no port. What the SSH door does (keys, the per-key
tally) and what a process does (signals, systemd, restarts) is proved by the end-to-end tier (`-m e2e`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agents.runtime.limits import TokenBucket
from agents.runtime.link import Link, Transport
from agents.runtime.memory import MemoryOpener, MemoryPipe
from agents.shell.agent import Agent
from agents.shell.channel import Channel
from agents.wire.lab.machines import Machine
from agents.wire.lab.model import Lab, load_lab
from agents.wire.protocol import EVENT_NOTICE, EVENT_TICK, LinkStatus, Role
from console.lab.client import FleetClient
from console.lab.state import LabState
from console.tui.app import CetlabApp


class InProcessLab:
    """A lab's agents started in this event loop; `down` ones refuse connections (a machine that is off)."""

    def __init__(self, lab_path: Path, state_root: Path):
        self.lab_path = lab_path
        self.lab: Lab = load_lab(lab_path)
        self.state_root = state_root
        self.agents: dict[str, Agent] = {}
        self.roles: dict[str, Role] = {}  # who -> role, as the agent's authorized_keys would say
        self.clients: list[InProcessClient] = []

    async def start(self, machines: list[str] | None = None) -> InProcessLab:
        for name in machines if machines is not None else [m.name for m in self.lab.machines]:
            await self.start_agent(name)
        return self

    async def start_agent(self, name: str) -> Agent:
        agent = Agent(self.lab, name, self.state_root / name)
        agent.serves_tcp = False  # no SSH server of its own: its consoles come through memory pipes
        await agent.start()
        self.agents[name] = agent
        return agent

    async def stop_agent(self, name: str) -> None:
        """The agent stops as its process would: its channels close, then new connections are refused."""
        agent = self.agents.pop(name)
        for client in self.clients:
            for pipe in client.memory.pipes:
                if isinstance(pipe.side, Channel) and pipe.side.agent is agent:
                    pipe.close()
        await agent.stop()

    def accept(self, role: Role, who: str):
        def accept(machine: Machine, pipe: MemoryPipe) -> Channel | None:
            agent = self.agents.get(machine.name)
            if agent is None:
                return None
            return Channel(agent, role, who, pipe, TokenBucket())

        return accept

    def client(self, role: Role = Role.OPERATOR, who: str = "test console", **kwargs: Any) -> InProcessClient:
        client = InProcessClient(self.lab, LabState(self.lab), opener=MemoryOpener(self.accept(role, who)), **kwargs)
        self.clients.append(client)
        return client

    def app(self, **kwargs: Any) -> CetlabApp:
        """The console on this lab, its client subscribed and handling events as the one CetlabApp makes itself."""
        client = self.client(subscribe=[EVENT_TICK, EVENT_NOTICE])
        app = CetlabApp(self.lab, client=client, **kwargs)
        client.on_event = app._on_event  # the toasts of notices, as on_mount's own client has them
        return app

    async def stop(self) -> None:
        for client in self.clients:
            await client.stop()
        for name in list(self.agents):
            await self.stop_agent(name)


class InProcessClient(FleetClient):
    """The console's client whose links open memory pipes (the opener) instead of SSH; everything above is FleetClient's."""

    def __init__(self, lab: Lab, state: LabState, *, opener: MemoryOpener, **kwargs: Any):
        super().__init__(lab, state, **kwargs)
        self.memory = opener

    async def start(self) -> None:
        self.core.start()  # no console key to read: no SSH

    async def open(self, link: Link) -> Transport:
        return await self.memory.open(link)

    async def explain(self, link: Link, exc: BaseException) -> tuple[LinkStatus, str] | None:
        return await self.memory.explain(link, exc)


def write_lab(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
