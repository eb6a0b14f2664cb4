"""The lab's audit trail: the agents' answers to audit.list merged into one list (for the CLI and the Audit view)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.wire.catalogue.audit import AUDIT_LIST, AuditEntry, AuditList, AuditRefusal
from agents.wire.catalogue.method import validate_reply
from agents.wire.protocol import RemoteError
from console.lab.replies import sent


@dataclass
class Trail:
    """Every machine's audit entries and refused calls, newest first, each with the machine that logged it."""

    entries: list[tuple[str, AuditEntry]] = field(default_factory=list)
    refusals: list[tuple[str, AuditRefusal]] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  # machine -> why it did not answer

    def to_json(self) -> dict[str, Any]:
        """`cetlab --json audit`: each entry and refusal as the agent sent it, with "machine"."""
        return {
            "entries": [{**sent(e), "machine": m} for m, e in self.entries],
            "refusals": [{**sent(r), "machine": m} for m, r in self.refusals],
            "unavailable": self.unavailable,
        }


def lab_trail(results: Mapping[str, Any], limit: int) -> Trail:
    """call_all answers of audit.list (raw, or typed; or the RemoteError of a machine not reached) -> one trail: the actions and
    the refusals (counted per key, method and minute), newest first, plus the machines that did not answer and why."""
    trail = Trail()
    for machine, result in results.items():
        if isinstance(result, Exception):
            trail.unavailable[machine] = result.message if isinstance(result, RemoteError) else str(result)
            continue
        try:
            answer = result if isinstance(result, AuditList) else validate_reply(AUDIT_LIST, result)
        except RemoteError as exc:  # a reply that does not validate: this machine's trail is unreadable, the others' are not
            trail.unavailable[machine] = exc.message
            continue
        trail.entries += [(machine, entry) for entry in answer.entries]
        trail.refusals += [(machine, row) for row in answer.refusals]
    trail.entries = sorted(trail.entries, key=lambda me: -me[1].t)[:limit]
    trail.refusals = sorted(trail.refusals, key=lambda mr: -mr[1].minute)[:limit]
    return trail


def merge_trails(results: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """The lab's trail as `cetlab --json audit` prints it (see lab_trail)."""
    return lab_trail(results, limit).to_json()


def refusals_line(refusals: list[tuple[str, AuditRefusal]], shown: int = 3) -> str:
    """The refused calls in one line: how many, then the newest groups (who, role, method, count)."""
    if not refusals:
        return "no calls refused for want of a role"
    total = sum(r.count for _, r in refusals)
    groups = ", ".join(f"{r.who} ({r.role}) {r.method} ×{r.count} on {machine}" for machine, r in refusals[:shown])
    more = f" and {len(refusals) - shown} more" if len(refusals) > shown else ""
    return f"{total} refused calls (a key without the role for the method): {groups}{more}"
