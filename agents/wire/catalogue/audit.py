"""The method catalogue: every RPC method with its params model, its result model, its role and its doc: audit."""

from __future__ import annotations

from pydantic import Field

from agents.wire.catalogue.method import OP, Method, Params
from agents.wire.protocol import (
    Finite,
    FiniteFloat,
)
from agents.wire.sections.base import Section


class AuditListParams(Params):
    limit: int = Field(default=200, ge=1, le=5000)
    since: float | None = None  # unix time
    before_id: int | None = Field(default=None, ge=1)  # page back from here
    who: str | None = Field(default=None, max_length=200)
    key: str | None = Field(default=None, max_length=200)  # a key's fingerprint (SHA256:...)
    method: str | None = Field(default=None, max_length=100)


class AuditEntry(Section):
    id: int
    t: FiniteFloat
    who: str
    role: str
    method: str
    params: str | None = None  # JSON, cut
    outcome: str  # ok, or the error code
    message: str | None = None
    duration_s: Finite = None
    key: str | None = None


class AuditRefusal(Section):
    minute: FiniteFloat
    who: str
    role: str
    method: str
    count: int
    key: str | None = None


class AuditList(Section):
    machine: str
    total: int = 0
    entries: list[AuditEntry] = Field(default_factory=list)
    refusals: list[AuditRefusal] = Field(default_factory=list)


AUDIT_LIST = Method(
    "audit.list",
    AuditListParams,
    AuditList,
    OP,
    "Operator actions on this agent, newest first (operators only: it names who did what).",
)
