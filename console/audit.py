"""The lab's audit trail: the agents' answers to audit.list merged into one list (for the CLI and the Audit view)."""

from __future__ import annotations

from typing import Any, Mapping

from agents.catalogue import AUDIT_LIST, AuditList, ReplyInvalid, validate_reply
from agents.protocol import RemoteError


def merge_trails(results: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """audit.list answers (typed, or raw and validated here) -> one list of actions and one of refusals (counted per
    key, method and minute), newest first, plus the machines that did not answer and why."""
    entries: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    unavailable: dict[str, str] = {}
    for machine, result in results.items():
        if isinstance(result, dict):
            try:
                result = validate_reply(AUDIT_LIST, result)
            except ReplyInvalid as exc:
                result = exc
        if isinstance(result, RemoteError):
            unavailable[machine] = result.message
        elif isinstance(result, AuditList):
            entries += [{**entry.model_dump(mode="json", exclude_unset=True), "machine": machine} for entry in result.entries]
            refusals += [{**row.model_dump(mode="json", exclude_unset=True), "machine": machine} for row in result.refusals]
    entries.sort(key=lambda e: -e["t"])
    refusals.sort(key=lambda r: -r["minute"])
    return {"entries": entries[:limit], "refusals": refusals[:limit], "unavailable": unavailable}


def refusals_line(refusals: list[dict[str, Any]], shown: int = 3) -> str:
    """The refused calls in one line: how many, then the newest groups (who, role, method, count)."""
    if not refusals:
        return "no refused calls"
    total = sum(r["count"] for r in refusals)
    groups = ", ".join(f"{r['who']} ({r['role']}) {r['method']} ×{r['count']} on {r['machine']}" for r in refusals[:shown])
    more = f" and {len(refusals) - shown} more" if len(refusals) > shown else ""
    return f"{total} refused calls (a key without the role for the method): {groups}{more}"
