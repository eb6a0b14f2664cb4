"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles: audit."""

from __future__ import annotations

from agents.wire.protocol import Finite
from agents.wire.sections.base import Section


class AuditSection(Section):
    count: int = 0  # rows in the trail; who did what is for operators, through audit.list
    last_t: Finite = None
