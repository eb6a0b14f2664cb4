"""A lab.yaml pushed to the agents (`cetlab lab push`): its version, and what changed between two labs for one machine.

The version is a short hash of the text itself, so the workstation and each agent compare the same bytes (a comment
edited is a new version). What changed is said per section, each either applied live by the running agent or waiting
for its next start: the agent's own address and GPUs, `via`, and where the gateway listens are bound when it starts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from agents.wire.lab.model import Lab
from agents.wire.lab.spread import node_links

VERSION_DIGITS = 12
# Of this machine's own entry: what the running agent bound or opened at start (its SSH port, its GPU sampler)
OWN_AT_START = ("host", "port", "via", "user", "ssh_port", "socket", "gpus", "sample_interval_s")
GATEWAY_AT_START = ("machine", "host", "port")  # where the gateway's HTTP server listens, and which agent runs it


def lab_version(text: str | bytes) -> str:
    """The version of a lab.yaml: the first 12 hex digits of the sha256 of its bytes."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:VERSION_DIGITS]


def file_version(lab: Lab) -> str | None:
    """The version of the file a lab was read from (the workstation's lab.yaml); None when it has none or is unreadable."""
    if lab.source is None:
        return None
    try:
        return lab_version(lab.source.read_bytes())
    except OSError:
        return None


@dataclass
class LabChanges:
    live: list[str] = field(default_factory=list)  # applied by the running agent
    restart: list[str] = field(default_factory=list)  # applied at its next start

    @property
    def any(self) -> bool:
        return bool(self.live or self.restart)


def _named(old: list[Any], new: list[Any], what: str) -> str | None:
    """A list of named entries compared by name: "models: +b -a ~c" (None: the same)."""
    before, after = {e.name: e for e in old}, {e.name: e for e in new}
    parts = [f"+{n}" for n in after if n not in before] + [f"-{n}" for n in before if n not in after]
    parts += [f"~{n}" for n in after if n in before and after[n] != before[n]]
    if not parts and [e.name for e in old] != [e.name for e in new]:
        parts = ["order"]
    return f"{what}: {' '.join(parts)}" if parts else None


def lab_changes(old: Lab, new: Lab, machine: str) -> LabChanges:
    """What differs between the lab an agent runs and a new one, for the agent of ``machine`` (in both labs)."""
    changes = LabChanges()
    mine_old, mine_new = old.machine(machine), new.machine(machine)
    at_start = [f"machines.{machine}.{k}" for k in OWN_AT_START if getattr(mine_old, k) != getattr(mine_new, k)]
    changes.restart += at_start
    # the peers this agent calls with the node role (a spread model's helpers, a multi-node recipe's nodes) are linked
    # when it starts: a new one waits for its next start (`warm` would say "no link" until then)
    linked = {callee for caller, callee in node_links(old) if caller == machine}
    changes.restart += [
        f"a node link to {callee}" for caller, callee in node_links(new) if caller == machine and callee not in linked
    ]
    others_old = [m for m in old.machines if m.name != machine]
    others_new = [m for m in new.machines if m.name != machine]
    said = _named(others_old, others_new, "machines")
    rest = mine_old.model_copy(update={k: getattr(mine_new, k) for k in OWN_AT_START}) != mine_new
    if said or rest:
        changes.live.append(said or f"machines: ~{machine}")
    old_gw, new_gw = old.gateway, new.gateway
    if (old_gw is None) != (new_gw is None) or (
        old_gw is not None and new_gw is not None and any(getattr(old_gw, k) != getattr(new_gw, k) for k in GATEWAY_AT_START)
    ):
        changes.restart.append("gateway (its machine, host or port)")
    elif old_gw != new_gw:
        changes.live.append("gateway")
    for name in ("models", "trainers", "providers"):
        said = _named(getattr(old, name), getattr(new, name), "recipes" if name == "trainers" else name)
        if said:
            changes.live.append(said)
    for name in ("lab", "costs", "cloud_prices", "orchestra", "alerts", "notify", "checkpoints", "console"):
        if getattr(old, name) != getattr(new, name):
            changes.live.append(name)
    return changes
