"""lab.yaml pushed onto the lab's agents with the peer trust it carries, and each machine's answer in words: one path
for `cetlab lab push` and for `cetlab machine add/remove` after a machine joined or left."""

from __future__ import annotations

from pathlib import Path

from agents.runtime.labfile import calls_peers
from agents.wire.catalogue.agent import HELLO
from agents.wire.catalogue.lab import LAB_APPLY, LabApplied, LabApplyParams
from agents.wire.catalogue.method import request_all
from agents.wire.lab.model import Lab
from agents.wire.protocol import ErrorCode, PeerKeys, RemoteError
from console.lab.client import FleetClient, host_pattern


def pinned_host_lines(lab: Lab, known_hosts: Path) -> list[str]:
    """The console's pinned host keys of the lab's machines (those its agents serve SSH for), as known_hosts lines the
    agents write as their peer known hosts: the key the console checks is the key the peers check."""
    import asyncssh

    if not known_hosts.exists():
        return []
    known = asyncssh.read_known_hosts(str(known_hosts))
    lines = []
    for machine in lab.machines:
        if machine.via != "agent":
            continue  # reached through its own sshd: no peer links to it
        for key in known.match(machine.host, "", machine.port)[0]:
            kind, blob = key.export_public_key().decode().split()[:2]
            line = f"{host_pattern(machine.host, machine.port)} {kind} {blob}"
            if line not in lines:
                lines.append(line)
    return lines


def said_line(name: str, reply: LabApplied | RemoteError) -> str:
    if isinstance(reply, RemoteError):
        return f"{name}: NOT APPLIED: {reply.message}"
    verb = "would apply" if reply.dry_run else "runs"
    head = f"{name}: {verb} lab.yaml {reply.version}" + (f" (was {reply.previous})" if reply.changed else " (unchanged)")
    parts = [head]
    if reply.live:
        parts.append(f"  live: {'; '.join(reply.live)}")
    if reply.restart:
        parts.append(f"  at the agent's next start: {'; '.join(reply.restart)}")
    if reply.peer_hosts or reply.authorized:
        parts.append(f"  peers: {reply.peer_hosts} host keys pinned, authorized: {', '.join(reply.authorized) or 'none'}")
    return "\n".join(parts)


async def push_lab(lab: Lab, client: FleetClient, dry_run: bool) -> tuple[dict[str, LabApplied | RemoteError], list[str]]:
    """lab.yaml's text onto every agent the client reaches, with the peer trust it carries; each machine's reply, and
    the machines that call peers and gave no peer key (to push again once they are online). `cetlab lab push`, and
    `cetlab machine add/remove` after the machine joined or left."""
    source = lab.source
    if source is None:
        raise RemoteError(ErrorCode.INVALID_PARAMS, "the lab was not read from a file: nothing to push")
    text = source.read_text()
    state = client.state
    said = {name: view.hello.peer_keys for name, view in state.machines.items() if view.hello is not None}
    keys = {name: k for name, k in said.items() if k is not None and k.made}
    callers = [m for m in state.machines if calls_peers(lab, m)]
    known_hosts = "\n".join(pinned_host_lines(lab, client.known_hosts))

    async def push(keys: dict[str, PeerKeys]) -> dict[str, LabApplied | RemoteError]:
        """The machines that let peers in first, then those that call them (the gateway's, a multi-node recipe's first
        node): a caller retries its links once its trust is written, and finds the other side ready."""
        params = LabApplyParams(text=text, known_hosts=known_hosts, peer_keys=keys, dry_run=dry_run)
        replies = await request_all(client, [m for m in state.machines if m not in callers], LAB_APPLY, params)
        replies.update(await request_all(client, callers, LAB_APPLY, params) if callers else {})
        return replies

    replies = await push(keys)
    # a machine that calls peers under this lab.yaml only (the gateway's, once a second machine joins) made its keys
    # with the push: ask for them, and push again so that the others let it in (the same text: trust only)
    late = [m for m in callers if m not in keys and isinstance(replies.get(m), LabApplied)]
    if late and not dry_run:
        hellos = await request_all(client, late, HELLO, None)
        fresh = {n: h.peer_keys for n, h in hellos.items() if not isinstance(h, RemoteError) and h.peer_keys is not None}
        keys.update({n: k for n, k in fresh.items() if k.made})
        if any(m in keys for m in late):
            again = await push(keys)
            for name, first in replies.items():
                second = again.get(name)
                if isinstance(first, LabApplied) and isinstance(second, LabApplied):
                    replies[name] = first.model_copy(update={"peer_hosts": second.peer_hosts, "authorized": second.authorized})
    missing = [m.name for m in lab.machines if m.name not in keys and calls_peers(lab, m.name)]
    return {name: replies[name] for name in state.machines}, missing
