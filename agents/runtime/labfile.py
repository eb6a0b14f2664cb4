"""The lab.yaml an agent runs, and the copies `cetlab lab push` keeps in its state dir.

An agent starts from its ``--lab`` file. A push writes the new text to ``<state>/lab.pushed.yaml`` (atomically: a
temporary file, fsync, rename) and keeps the one it replaces as ``lab.previous.yaml`` for ``lab rollback``. The state
dir, not /etc or the --lab file: a systemd unit's agent cannot write outside it (ProtectSystem=strict), and one folder
holds what this machine runs. At the next start the pushed copy wins over ``--lab`` (the log says so), so a restart
runs what was last pushed; delete it to go back to the --lab file. Relative paths in a pushed lab.yaml resolve
against the --lab file's folder, as the same lab's paths did before the push.

Peer trust comes with the push too: the lab's pinned host keys become the agent's peer known hosts, and the peer keys
the lab needs of the other agents go into ``authorized_keys.pushed``, beside (never into) the hand-made
``authorized_keys``, with the gateway or node role only (agents/runtime/keys.py reads both).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from agents.runtime.keys import PUSHED_AUTHORIZED_KEYS_NAME, KeyFileError, write_private
from agents.wire.lab.model import Lab, LabError, parse_lab
from agents.wire.lab.push import lab_version
from agents.wire.lab.queue import queues_jobs, scheduler_machine
from agents.wire.lab.spread import node_links
from agents.wire.protocol import PeerKeys, Role
from agents.wire.sections.lab import LabSource

log = logging.getLogger("cetlab.agent")

PUSHED_NAME = "lab.pushed.yaml"
PREVIOUS_NAME = "lab.previous.yaml"


@dataclass(frozen=True)
class Running:
    """The lab an agent runs, its text's version and where the text came from."""

    lab: Lab
    version: str
    source: LabSource
    text: str
    base: Path | None  # the --lab file: a pushed lab's relative paths resolve against its folder


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file whole or not at all (a crash leaves the old one): temp file in the same folder, fsync, rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def parse_for(text: str, machine: str, base: Path | None, engines: Collection[str] | None) -> Lab:
    """A pushed text as this agent would run it: valid (errors as lab.yaml:LINE: ...), with this machine in it, its
    relative paths against ``base`` (the --lab file)."""
    lab = parse_lab(text, source="lab.yaml", path=base, engines=engines)
    if machine not in {m.name for m in lab.machines}:
        names = ", ".join(m.name for m in lab.machines)
        raise LabError([f"lab.yaml:1: no machine named {machine!r} (machines: {names}); this agent serves {machine}"])
    return lab


def running_lab(lab: Lab, machine: str, state_dir: Path, engines: Collection[str] | None) -> Running:
    """What the agent runs at start: the pushed copy in its state dir when there is a valid one, else its --lab."""
    text = ""
    if lab.source is not None:
        try:
            text = lab.source.read_text()
        except (OSError, UnicodeDecodeError):
            text = ""
    from_file = Running(lab, lab_version(text or lab.model_dump_json()), "file", text, lab.source)
    pushed = state_dir / PUSHED_NAME
    if not pushed.is_file():
        return from_file
    try:
        pushed_text = pushed.read_text()
        new = parse_for(pushed_text, machine, lab.source, engines)
    except (OSError, UnicodeDecodeError, LabError) as exc:
        log.error("%s is not usable, running %s instead: %s", pushed, lab.source, exc)
        return from_file
    version = lab_version(pushed_text)
    log.info(
        "running the lab.yaml pushed to %s (version %s) rather than --lab %s (delete it to use --lab)",
        pushed,
        version,
        lab.source,
    )
    return Running(new, version, "pushed", pushed_text, lab.source)


def keep_pushed(state_dir: Path, text: str, replaced: str) -> None:
    """The new text becomes the pushed copy; the one it replaces (``replaced``, what the agent ran) the previous one."""
    atomic_write(state_dir / PREVIOUS_NAME, replaced.encode())
    atomic_write(state_dir / PUSHED_NAME, text.encode())


def previous_text(state_dir: Path) -> str | None:
    path = state_dir / PREVIOUS_NAME
    return path.read_text() if path.is_file() else None


def calls_peers(lab: Lab, machine: str) -> bool:
    """This machine's agent calls the others: the gateway's and the lab queue's (in a lab of more than one machine;
    the queue's where lab.yaml has recipes), the first node of a multi-node recipe, or the machine of a model spread
    over others (rpc:). Only such an agent has peer known hosts and a client key the others authorize."""
    several = len(lab.machines) > 1
    gateway = lab.gateway is not None and lab.gateway.machine == machine and several
    queue = several and queues_jobs(lab) and scheduler_machine(lab) == machine
    return gateway or queue or any(caller == machine for caller, _ in node_links(lab))


def known_hosts_lines(text: str) -> list[str]:
    """The host key lines of a pushed known_hosts text, each checked (a line asyncssh cannot read is refused, named)."""
    lines = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        import asyncssh  # only where there are lines to read: an agent that calls no peer never loads it for a push

        try:
            asyncssh.import_known_hosts(line)
        except (ValueError, asyncssh.KeyImportError) as exc:
            raise KeyFileError(f"known_hosts:{number}: not a known_hosts line: {exc}") from None
        lines.append(line)
    return lines


def needed_peer_keys(lab: Lab, machine: str, keys: Mapping[str, PeerKeys]) -> list[tuple[Role, str, str]]:
    """The (role, public key, comment) this machine lets in for the lab: the gateway's agent links to every other
    machine (a checkpoint may be served on one lab.yaml gives no model) with the gateway role; the first node of a
    multi-node recipe calls its other nodes, and a spread model's machine its rpc helpers, with the node role. Never
    operator or viewer."""
    needed: list[tuple[Role, str, str]] = []
    gateway = lab.gateway.machine if lab.gateway is not None else None
    if gateway is not None and gateway != machine and (key := keys.get(gateway)) is not None and key.peer:
        needed.append((Role.GATEWAY, key.peer, f"gateway@{gateway}"))
    queue = scheduler_machine(lab)
    if queues_jobs(lab) and queue != machine and (key := keys.get(queue)) is not None and key.scheduler:
        needed.append((Role.SCHEDULER, key.scheduler, f"scheduler@{queue}"))
    for caller, callee in node_links(lab):
        if callee == machine and (key := keys.get(caller)) is not None and key.node:
            entry = (Role.NODE, key.node, f"node@{caller}")
            if entry not in needed:
                needed.append(entry)
    return needed


def authorized_lines(keys: list[tuple[Role, str, str]]) -> list[str]:
    """The pushed authorized_keys lines of these keys, each checked first (one that is not a public key is refused)."""
    lines = []
    for role, public, comment in keys:
        import asyncssh  # only where a key is authorized

        try:
            key = asyncssh.import_public_key(" ".join(public.split()[:2]))
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise KeyFileError(f"the peer key of {comment}: not a public key: {exc}") from None
        kind, blob = key.export_public_key().decode().split()[:2]
        lines.append(f"{role} {kind} {blob} {comment}")
    return lines


def write_pushed_trust(state_dir: Path, known_hosts: list[str], authorized: list[str], peer_known_hosts: str) -> None:
    """The peer known hosts (when the push carried any) and the pushed authorizations (replaced whole, each time)."""
    if known_hosts:
        write_private(state_dir / peer_known_hosts, ("\n".join(known_hosts) + "\n").encode())
    atomic_write(state_dir / PUSHED_AUTHORIZED_KEYS_NAME, "".join(f"{line}\n" for line in authorized).encode())
