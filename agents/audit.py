"""The audit trail: every call of an operator method (who, what, params, when, outcome) kept in SQLite."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from agents.protocol import Role, Telemetry
from agents.rpc import Peer
from agents.sections import AuditSection

if TYPE_CHECKING:
    from agents.agent import Agent

PARAMS_SUMMARY_CHARS = 300
MESSAGE_CHARS = 300
KEEP_ROWS = 100_000  # the newest rows kept; older ones are dropped a thousand at a time
NOT_AUDITED = {"audit.list"}  # reading the trail is not an action (and the :audit view polls it)

SCHEMA = [
    """CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        t REAL NOT NULL,            -- unix time the call arrived
        who TEXT NOT NULL,          -- key comment, fingerprint, or socket user
        role TEXT NOT NULL,         -- the caller's role
        method TEXT NOT NULL,
        params TEXT,                -- JSON, cut at PARAMS_SUMMARY_CHARS
        outcome TEXT NOT NULL,      -- ok, or the error code (forbidden, invalid_params, conflict ...)
        message TEXT,               -- the error message
        duration_s REAL NOT NULL
    )""",
    "CREATE INDEX audit_t ON audit(t)",
]


class AuditListParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=200, ge=1, le=5000)
    since: float | None = None  # unix time
    before_id: int | None = Field(default=None, ge=1)  # page back from here
    who: str | None = Field(default=None, max_length=200)
    method: str | None = Field(default=None, max_length=100)


def summarize(params: Any) -> str | None:
    if params is None:
        return None
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= PARAMS_SUMMARY_CHARS else text[: PARAMS_SUMMARY_CHARS - 1] + "…"


class AuditComponent:
    """Writes the trail from the RPC dispatcher; serves it to operators as `audit.list`."""

    name = "audit"

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.count = 0
        self.last_t: float | None = None

    async def start(self, agent: Agent) -> None:
        self.agent = agent
        agent.store.migrate(self.name, SCHEMA)
        row = agent.store.query("SELECT COUNT(*) AS n, MAX(t) AS t FROM audit")[0]
        self.count, self.last_t = row["n"], row["t"]
        agent.rpc.audit = self.record

        @agent.rpc.method("audit.list", role=Role.OPERATOR, params=AuditListParams,
                          doc="Operator actions on this agent, newest first (operators only: it names who did what).")
        async def audit_list(peer: Peer, params: AuditListParams) -> dict:
            where, args = [], []
            for clause, value in (("t >= ?", params.since), ("id < ?", params.before_id), ("who = ?", params.who), ("method = ?", params.method)):
                if value is not None:
                    where.append(clause)
                    args.append(value)
            rows = agent.store.query(
                f"SELECT * FROM audit {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id DESC LIMIT ?", (*args, params.limit))
            return {"machine": agent.machine.name, "total": self.count, "entries": rows}

    async def stop(self) -> None:
        pass

    def on_telemetry(self, telemetry: Telemetry) -> None:
        pass

    def section(self) -> AuditSection:
        # counts only: who did what is for operators, through audit.list
        return AuditSection(count=self.count, last_t=self.last_t)

    def record(self, peer: Peer, method: str, params: Any, response: dict[str, Any], duration_s: float) -> None:
        if method in NOT_AUDITED:
            return
        error = response.get("error")
        now = time.time()
        with self.agent.store.transaction() as db:
            db.execute(
                "INSERT INTO audit (t, who, role, method, params, outcome, message, duration_s) VALUES (?,?,?,?,?,?,?,?)",
                (now - duration_s, peer.who, str(peer.role), method, summarize(params),
                 error.get("code", "error") if error else "ok", (error.get("message") or "")[:MESSAGE_CHARS] if error else None,
                 round(duration_s, 4)),
            )
            self.count += 1
            if self.count >= KEEP_ROWS + 1000:
                db.execute("DELETE FROM audit WHERE id <= (SELECT MAX(id) FROM audit) - ?", (KEEP_ROWS,))
                self.count = KEEP_ROWS
        self.last_t = now - duration_s
