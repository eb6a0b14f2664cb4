"""The audit trail: every operator action (who, what, params, when, outcome) kept in SQLite; refusals counted apart."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from agents.runtime.hooks import Hooks
from agents.runtime.rpc import Peer
from agents.wire.catalogue.audit import AUDIT_LIST, AuditEntry, AuditList, AuditListParams, AuditRefusal
from agents.wire.protocol import Role, Telemetry
from agents.wire.sections.audit import AuditSection

if TYPE_CHECKING:
    from agents.runtime.core import AgentCore

PARAMS_SUMMARY_CHARS = 300
MESSAGE_CHARS = 300
KEEP_ROWS = 100_000  # the newest actions kept; older ones are dropped a thousand at a time
# Refused calls (a viewer calling an operator method) are counted per key, method and minute in their
# own table, so no flood of refusals can push an operator's action out of the trail.
KEEP_REFUSAL_ROWS = 10_000
STARTED = "started"  # the outcome of an action still running (or cut short by the agent stopping)
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
    """CREATE TABLE audit_refusals (
        minute REAL NOT NULL,       -- unix time of the minute's start
        who TEXT NOT NULL,
        role TEXT NOT NULL,
        method TEXT NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (minute, who, method)
    )""",
    # the key's fingerprint beside its comment: two keys with one comment are two callers (None: the unix socket)
    "ALTER TABLE audit ADD COLUMN key TEXT",
    "ALTER TABLE audit_refusals ADD COLUMN key TEXT",
]


def summarize(params: Any) -> str | None:
    if params is None:
        return None
    text = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= PARAMS_SUMMARY_CHARS else text[: PARAMS_SUMMARY_CHARS - 1] + "…"


class AuditComponent(Hooks):
    """Writes the trail from the RPC dispatcher; serves it to operators as `audit.list`."""

    name = "audit"

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self.count = 0
        self.last_t: float | None = None
        self._refusals: dict[
            tuple[float, str, str | None, str, str], int
        ] = {}  # (minute, who, key, role, method) -> refused calls

        @core.rpc.implements(AUDIT_LIST)
        async def audit_list(peer: Peer, params: AuditListParams) -> AuditList:
            where: list[str] = []
            args: list[Any] = []
            for clause, value in (
                ("t >= ?", params.since),
                ("id < ?", params.before_id),
                ("who = ?", params.who),
                ("key = ?", params.key),
                ("method = ?", params.method),
            ):
                if value is not None:
                    where.append(clause)
                    args.append(value)
            rows = core.store.query(
                f"SELECT * FROM audit {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id DESC LIMIT ?",
                (*args, params.limit),
            )
            self._flush_refusals()
            refusals = self._refusal_rows(params)
            return AuditList(
                machine=core.machine.name,
                total=self.count,
                entries=[AuditEntry.model_validate(r) for r in rows],
                refusals=[AuditRefusal.model_validate(r) for r in refusals],
            )

    async def start(self) -> None:
        store = self.core.store
        store.migrate(self.name, SCHEMA)
        row = store.query("SELECT COUNT(*) AS n, MAX(t) AS t FROM audit")[0]
        self.count, self.last_t = row["n"], row["t"]
        if store.notice:  # the state was lost or moved aside at this start: the trail says so first
            with store.transaction() as db:
                db.execute(
                    "INSERT INTO audit (t, who, role, method, params, outcome, message, duration_s) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        time.time(),
                        "cetlab-agent",
                        str(Role.OPERATOR),
                        "agent.start",
                        None,
                        "state_lost",
                        store.notice[:MESSAGE_CHARS],
                        0.0,
                    ),
                )
            self.count += 1
        self.core.rpc.audit = self  # the dispatcher writes every operator action here from now on

    def _refusal_rows(self, params: AuditListParams) -> list[dict[str, Any]]:
        """Refused calls per key, method and minute, newest first (the same filters as the actions)."""
        where: list[str] = []
        args: list[Any] = []
        for clause, value in (
            ("minute >= ?", None if params.since is None else params.since - params.since % 60),
            ("who = ?", params.who),
            ("key = ?", params.key),
            ("method = ?", params.method),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        return self.core.store.query(
            f"SELECT * FROM audit_refusals {'WHERE ' + ' AND '.join(where) if where else ''} "
            "ORDER BY minute DESC, who, method LIMIT ?",
            (*args, params.limit),
        )

    async def stop(self) -> None:
        self._flush_refusals()

    def on_telemetry(self, telemetry: Telemetry) -> None:
        self._flush_refusals()

    def section(self) -> AuditSection:
        # counts only: who did what is for operators, through audit.list
        return AuditSection(count=self.count, last_t=self.last_t)

    def begin(self, peer: Peer, method: str, params: Any) -> int | None:
        """Write the action's row before it runs; an error here (a full disk) refuses the action."""
        if method in NOT_AUDITED:
            return None
        now = time.time()
        with self.core.store.transaction() as db:
            row_id = db.execute(
                "INSERT INTO audit (t, who, key, role, method, params, outcome, message, duration_s) VALUES (?,?,?,?,?,?,?,?,?)",
                (now, peer.who, peer.key, str(peer.role), method, summarize(params), STARTED, None, 0.0),
            ).lastrowid
            if row_id is None:
                raise RuntimeError("state.db gave the audit row no id")
            self.count += 1
            if self.count >= KEEP_ROWS + 1000:
                db.execute("DELETE FROM audit WHERE id <= ?", (row_id - KEEP_ROWS,))
                self.count = KEEP_ROWS
        self.last_t = now
        return row_id

    def end(self, token: int | None, response: dict[str, Any], duration_s: float) -> None:
        """The action's outcome: ok, or its error code and message."""
        if token is None:
            return
        error = response.get("error")
        self.core.store.execute(
            "UPDATE audit SET outcome=?, message=?, duration_s=? WHERE id=?",
            (
                error.get("code", "error") if error else "ok",
                (error.get("message") or "")[:MESSAGE_CHARS] if error else None,
                round(duration_s, 4),
                token,
            ),
        )

    def refused(self, peer: Peer, method: str) -> None:
        """One more refused call of this key and method in this minute: counted in memory, written once a tick."""
        if method in NOT_AUDITED:
            return
        now = time.time()
        key = (now - now % 60, peer.who, peer.key, str(peer.role), method)
        self._refusals[key] = self._refusals.get(key, 0) + 1

    def _flush_refusals(self) -> None:
        """The refusals counted since the last flush, in one transaction (bounded table, apart from actions)."""
        if not self._refusals:
            return
        counted, self._refusals = self._refusals, {}
        with self.core.store.transaction() as db:
            db.executemany(
                "INSERT INTO audit_refusals (minute, who, key, role, method, count) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT (minute, who, method) DO UPDATE SET count = count + excluded.count",
                [(*key, n) for key, n in counted.items()],
            )
            excess = db.execute("SELECT COUNT(*) FROM audit_refusals").fetchone()[0] - KEEP_REFUSAL_ROWS
            if excess > 0:
                db.execute(
                    "DELETE FROM audit_refusals WHERE rowid IN (SELECT rowid FROM audit_refusals ORDER BY minute LIMIT ?)",
                    (excess,),
                )
