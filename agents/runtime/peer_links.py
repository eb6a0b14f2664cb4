"""A peer link's state as the doctor reads it, and the port of the components that keep such links (light: no SSH stack,
so an agent that keeps none imports nothing of asyncssh for its doctor)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from agents.wire.lab.model import Lab
from agents.wire.protocol import LinkStatus

# an agent's links to its peers (agents/runtime/peers.py), here so that who only reads them needs no SSH stack
BACKOFF_MAX_S = 15.0
KEEPALIVE_S = 5.0
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class PeerLinkState:
    """One link of this agent to a peer, for the doctor: which key, which known_hosts, the role it needs there."""

    purpose: str  # what the link is for: "gateway", "multi-node"
    machine: str
    status: LinkStatus
    error: str | None
    key_path: Path
    known_hosts: Path
    role: str  # the role the peer must give this agent's key

    def fix(self, lab: Lab) -> str | None:
        """The one command, run on this agent's machine, that makes the link work (None: it works, or waiting will do)."""
        peer = lab.machine(self.machine)
        if self.status is LinkStatus.UNTRUSTED:
            return (
                f"ssh {peer.host} cetlab-agent host-key --machine {peer.name} "
                f"| sed 's/^/[{peer.host}]:{peer.port} /' >> {self.known_hosts}"
            )
        if self.status is LinkStatus.REFUSED:
            return f"ssh {peer.host} cetlab-agent authorize --machine {peer.name} --role {self.role} - < {self.key_path}.pub"
        return None


@runtime_checkable
class PeerLinksPort(Protocol):
    """A component that keeps links to peers (the gateway, a multi-node coordinator): their states, for the doctor."""

    def peer_links(self) -> list[PeerLinkState]: ...
