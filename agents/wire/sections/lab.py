"""The lab.yaml an agent runs: its version (a short hash of the text), where it came from, what waits for a restart."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agents.wire.sections.base import Section

LabSource = Literal["file", "pushed"]  # the agent's --lab file, or the copy `cetlab lab push` wrote in its state dir


class LabSection(Section):
    version: str  # the first 12 hex digits of the sha256 of the lab.yaml text (`cetlab lab push` compares them)
    source: LabSource = "file"
    applied_at: float | None = None  # when the pushed copy was applied (None: read at start)
    # changes pushed that this agent applies at its next start only (its own port, `via`, its GPUs, the gateway's place)
    restart_pending: list[str] = Field(default_factory=list)
