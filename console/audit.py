"""The lab's audit trail: the agents' answers to audit.list merged into one list (for the CLI and the Audit view)."""

from __future__ import annotations

from typing import Any

from agents.protocol import RemoteError


def merge_trails(results: dict[str, Any], limit: int) -> dict[str, Any]:
    """call_all answers of audit.list -> one list, newest first, plus the machines that did not answer and why."""
    entries, unavailable = [], {}
    for machine, result in results.items():
        if isinstance(result, RemoteError):
            unavailable[machine] = result.message
        elif isinstance(result, dict):
            entries += [{**entry, "machine": machine} for entry in result["entries"]]
    entries.sort(key=lambda e: -e["t"])
    return {"entries": entries[:limit], "unavailable": unavailable}
