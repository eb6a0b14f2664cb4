"""How an agent that calls the others (the gateway, the lab queue) reaches each machine: its own in-process, the
others through their agents.

Its own machine needs no SSH to itself: it is asked through this agent's own handlers (with the caller's role's
rights: the gateway's, the scheduler's), so a one-machine lab needs no peer key, no authorization of it and no
known_hosts entry. The other machines are reached over the peers' SSH links; one that cannot be reached is said at
once, with what its link says and what fixes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agents.runtime.peer_links import CONNECT_TIMEOUT_S
from agents.runtime.rpc import Peer
from agents.runtime.view import MachineView
from agents.wire.engine_address import EngineAddress
from agents.wire.protocol import ErrorCode, LinkStatus, RemoteError, Role
from agents.wire.sections.models import ModelsSection

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore
    from agents.runtime.peers import PeerClient  # asyncssh: only where the agent has peers to call

SETTLE_S = 2 * CONNECT_TIMEOUT_S  # a link still on its first attempt: how long a request waits for its outcome


class Unreachable(Exception):
    """A machine the caller cannot reach now: its link's state, why, and what fixes it."""

    def __init__(self, machine: str, status: str, why: str | None, fix: str) -> None:
        self.machine, self.status, self.why, self.fix = machine, status, why, fix
        super().__init__(f"{machine} is {status}" + (f" ({why})" if why else "") + f": {fix}")


def _fix(machine: str, status: str, peers: PeerClient, role: Role) -> str:
    """What to do about a link in this state, in one sentence with the command."""
    if status == LinkStatus.REFUSED:
        return (
            f"authorize the {role}'s key on {machine}: run `cetlab lab push` on the workstation, or by hand copy {peers.key_path}.pub there and run "
            f"`cetlab-agent authorize --machine {machine} --role {role} {peers.key_path.name}.pub`"
        )
    if status == LinkStatus.UNTRUSTED:
        return (
            f"add {machine}'s agent host key to {peers.known_hosts}: run `cetlab lab push` on the workstation (it pins the "
            f"console's known host keys here), or by hand on {machine} run `cetlab-agent host-key --machine {machine}` "
            f"and append `[{peers.lab.machine(machine).host}]:{peers.lab.machine(machine).port} <that key>` here"
        )
    return f"start the agent on {machine} (`cetlab-agent serve --lab lab.yaml --machine {machine}`) or check its network; the {role} retries"


class Reach:
    """The views of every machine (its GPUs, jobs and models) and the calls to their agents, as the gateway's router
    and the lab queue need them; calls to its own machine carry ``role``'s rights, as the others' keys do."""

    def __init__(self, core: AgentCore, peers: PeerClient | None, role: Role = Role.GATEWAY) -> None:
        self.core = core
        self.own = core.machine.name
        self.peers = peers
        self.role = role
        self._local = MachineView(core.machine)
        self._local.set_link(LinkStatus.ONLINE)
        self._seen: object = None  # the tick's models section last copied into the local view
        self._seen_jobs: object = None
        self._caller = Peer(role=role, who=f"{role} (this machine)", send=lambda _line: None)

    # -- what each machine's models are

    def view(self, machine: str) -> MachineView | None:
        if machine == self.own:
            section = self.core.current.get("models")
            if isinstance(section, ModelsSection) and section is not self._seen:  # a new tick: ≤ 1 s old
                self._seen = section
                self._local.models = section
            jobs = self.core.current.get("jobs")
            if isinstance(jobs, list) and jobs is not self._seen_jobs:
                self._seen_jobs = jobs
                self._local.jobs = jobs
            latest = self.core.latest
            if latest is not None:
                self._local.gpus = {g.index: g for g in latest.gpus}
            return self._local
        return self.peers.views.machines.get(machine) if self.peers is not None else None

    def all_views(self) -> Iterator[tuple[str, MachineView]]:
        own = self.view(self.own)
        if own is not None:
            yield self.own, own
        if self.peers is not None:
            yield from self.peers.views.machines.items()

    def apply_models(self, machine: str, listing: ModelsSection) -> None:
        """A fresh listing: the models as they are now."""
        if machine == self.own:
            self._local.models = ModelsSection(models=listing.models, rotation=listing.rotation)
        elif self.peers is not None:
            self.peers.views.apply_models(machine, listing)

    def links(self) -> dict[str, str]:
        """Each other machine's link, as the gateway's section shows it (its own is no peer: asked in-process)."""
        return {n: str(link.status) for n, link in self.peers.links.items()} if self.peers is not None else {}

    # -- calls (the Caller of agents/wire/catalogue/method.py)

    async def call(self, machine: str, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        if machine != self.own:
            if self.peers is None:
                raise RemoteError(ErrorCode.NOT_FOUND, f"no machine named {machine!r} in the lab")
            return await self.peers.call(machine, method, params, timeout)
        response = await self.core.rpc.dispatch(self._caller, {"id": 0, "method": method, "params": params or {}})
        error = response.get("error")
        if error is not None:
            raise RemoteError(error.get("code", ErrorCode.INTERNAL), error.get("message", ""), error.get("data"))
        return response["result"]

    async def tunnel(self, machine: str, target: EngineAddress) -> str:
        if self.peers is None:
            raise RemoteError(ErrorCode.NOT_FOUND, f"no peer named {machine!r}")
        return await self.peers.tunnel(machine, target)

    async def reachable(self, machine: str) -> None:
        """Raise Unreachable unless the machine's agent can be asked now (a first attempt is waited for, briefly)."""
        if machine == self.own or self.peers is None:
            return
        link = self.peers.links.get(machine)
        if link is None:
            return
        if not link.settled.is_set():
            try:
                async with asyncio.timeout(SETTLE_S):
                    await link.settled.wait()
            except TimeoutError:
                pass
        if link.status is not LinkStatus.ONLINE:
            raise Unreachable(machine, str(link.status), link.error, _fix(machine, link.status, self.peers, self.role))

    async def wait_online(self, machine: str) -> None:
        """A lost connection: wait until it is back (raises Unreachable at once if it is refused or untrusted)."""
        if self.peers is None or machine == self.own:
            return
        link = self.peers.links[machine]
        if link.status in (LinkStatus.REFUSED, LinkStatus.UNTRUSTED):
            raise Unreachable(machine, str(link.status), link.error, _fix(machine, link.status, self.peers, self.role))
        await link.online.wait()
