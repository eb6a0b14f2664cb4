"""`lab.apply` and `lab.rollback` on the agent: a pushed lab.yaml validated, kept, and applied live.

The text is validated with the loader `cetlab lab check` uses (errors as lab.yaml:LINE:COL) and must still name this
machine; nothing is written or changed before it passes. Then the pushed copy is written in the state dir (the one it
replaces kept for rollback; agents/runtime/labfile.py), the peer trust it carries is written, and every component
that has ``reconfigure(old, new)`` takes the new lab while the agent runs: the model pool adds and drops models (a
warm engine stays warm), recipes, routes, gateway policies, alerts, notification routes and prices follow the new
lab at once. What was bound at start (the agent's port, `via`, its GPUs, where the gateway listens) is said and
applied at the next start. The call itself is audited like every operator action; the log says what changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from agents.runtime.keys import KeyFileError, ensure_key
from agents.runtime.labfile import (
    Running,
    authorized_lines,
    calls_peers,
    keep_pushed,
    known_hosts_lines,
    needed_peer_keys,
    parse_for,
    previous_text,
    write_pushed_trust,
)
from agents.runtime.rpc import Peer
from agents.wire.catalogue.lab import LAB_APPLY, LAB_ROLLBACK, LabApplied, LabApplyParams, LabRollbackParams
from agents.wire.lab.check import editor_line
from agents.wire.lab.model import Lab, LabError
from agents.wire.lab.push import lab_changes, lab_version
from agents.wire.lab.queue import queues_jobs, scheduler_machine
from agents.wire.lab.spread import node_links
from agents.wire.protocol import ErrorCode, PeerKeys, RemoteError
from agents.wire.sections.lab import LabSection

if TYPE_CHECKING:
    from agents.shell.agent import Agent

log = logging.getLogger("cetlab.agent")


def _public(agent: Agent, name: str, comment: str) -> str:
    return ensure_key(agent.state_dir / name, comment=comment).export_public_key().decode().strip()


def peer_keys_of(agent: Agent) -> PeerKeys:
    """The client keys this agent calls the others with, as the lab needs them (made on first ask): the gateway's
    machine its peer key, the lab queue's its scheduler key, a multi-node recipe's first node its node key; the console
    authorizes them with a push."""
    lab, name = agent.lab, agent.machine.name
    if not calls_peers(lab, name):
        return PeerKeys()
    # with its SSH client: only where the agent calls peers
    from agents.runtime.peers import NODE_KEY_NAME, PEER_KEY_NAME, SCHEDULER_KEY_NAME

    peer = node = scheduler = None
    if lab.gateway is not None and lab.gateway.machine == name:
        peer = _public(agent, PEER_KEY_NAME, f"cetlab-gateway@{name}")
    if queues_jobs(lab) and scheduler_machine(lab) == name:
        scheduler = _public(agent, SCHEDULER_KEY_NAME, f"cetlab-scheduler@{name}")
    if any(caller == name for caller, _ in node_links(lab)):  # a multi-node recipe's first node, a spread model's machine
        node = _public(agent, NODE_KEY_NAME, f"cetlab-node@{name}")
    return PeerKeys(peer=peer, node=node, scheduler=scheduler)


async def reconfigure(agent: Agent, old: Lab, new: Lab) -> list[str]:
    """Give every component the new lab; what one could not take live (its error) is returned, to be said."""
    agent.lab = new
    agent.machine = new.machine(agent.machine.name)  # its figures (rates, watts); the port and GPUs stay as bound
    failed = []
    for component in agent.components:
        take = getattr(component, "reconfigure", None)
        if take is None:
            continue
        try:
            await take(old, new)
        except Exception as exc:
            log.exception("%s could not take the new lab.yaml live", component.name)
            failed.append(f"{component.name}: not applied live ({type(exc).__name__}: {exc}); applied at the next start")
    return failed


async def apply(agent: Agent, text: str, params: LabApplyParams | None, who: str, dry_run: bool) -> LabApplied:
    """Validate ``text``, then (unless ``dry_run``) keep it, write the peer trust it carries and apply it live."""
    from agents.orchestra.engines import ENGINES

    machine = agent.machine.name
    try:
        # off the loop: a big (or hostile) text's validation must not stall the ticks and the other consoles' calls
        new = await asyncio.to_thread(parse_for, text, machine, agent.running.base, ENGINES)
    except LabError as exc:
        lines = [editor_line(p, "lab.yaml") for p in exc.problems]
        raise RemoteError(
            ErrorCode.INVALID_PARAMS, f"{machine} refused the lab.yaml (nothing changed):\n" + "\n".join(lines)
        ) from None
    keys = needed_peer_keys(new, machine, params.peer_keys) if params is not None else []
    try:  # the trust it carries checked too, before anything is written
        hosts = known_hosts_lines(params.known_hosts) if params is not None and calls_peers(new, machine) else []
        authorized = authorized_lines(keys)
    except KeyFileError as exc:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"{machine} refused the push (nothing changed): {exc}") from None
    version = lab_version(text)
    old = agent.lab
    changes = lab_changes(old, new, machine)
    pending = lab_changes(agent.started_lab, new, machine).restart  # against what was bound at start: a revert clears it
    reply = LabApplied(
        version=version,
        previous=agent.running.version,
        changed=version != agent.running.version,
        live=changes.live,
        restart=changes.restart,
        peer_hosts=len(hosts),
        authorized=[comment for _, _, comment in keys],
        dry_run=dry_run,
    )
    if dry_run:
        return reply
    state_dir = agent.state_dir
    if reply.changed:
        await asyncio.to_thread(keep_pushed, state_dir, text, agent.running.text)
    if params is not None:
        known_name = ""
        if hosts:  # an agent that calls peers: its SSH client is loaded anyway
            from agents.runtime.peers import PEER_KNOWN_HOSTS_NAME

            known_name = PEER_KNOWN_HOSTS_NAME
        await asyncio.to_thread(write_pushed_trust, state_dir, hosts, authorized, known_name)
        for component in agent.components:  # the links that waited for this trust try again now
            retry = getattr(component, "retry_peers", None)
            if retry is not None:
                retry()
    if not reply.changed:  # the same text: its trust written again, nothing else to do
        return reply
    agent.running = Running(new, version, "pushed", text, agent.running.base)
    failed = await reconfigure(agent, old, new)
    agent.lab_section = LabSection(version=version, source="pushed", applied_at=time.time(), restart_pending=pending + failed)
    log.info(
        "%s applied lab.yaml %s (was %s)%s%s%s",
        who,
        version,
        reply.previous,
        f"; live: {', '.join(changes.live)}" if changes.live else "",
        f"; at the next start: {', '.join(changes.restart + failed)}" if changes.restart or failed else "",
        f"; peer hosts {len(hosts)}, authorized {', '.join(reply.authorized) or 'none'}" if params is not None else "",
    )
    return reply.model_copy(update={"restart": changes.restart + failed})


def register_lab_methods(agent: Agent) -> None:
    rpc = agent.rpc
    lock = asyncio.Lock()  # one push at a time: the files and the components see one lab after another

    @rpc.implements(LAB_APPLY)
    async def lab_apply(peer: Peer, params: LabApplyParams) -> LabApplied:
        async with lock:
            return await apply(agent, params.text, params, peer.who, params.dry_run)

    @rpc.implements(LAB_ROLLBACK)
    async def lab_rollback(peer: Peer, params: LabRollbackParams) -> LabApplied:
        async with lock:
            text = await asyncio.to_thread(previous_text, agent.state_dir)
            if text is None:
                raise RemoteError(
                    ErrorCode.CONFLICT,
                    f"no previous lab.yaml on {agent.machine.name}: none was pushed there (nothing to roll back)",
                )
            return await apply(agent, text, None, peer.who, params.dry_run)
