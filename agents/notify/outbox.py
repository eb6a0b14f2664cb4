"""The durable queue: every notification is a row in the agent's state.db before it is sent, until it is accepted."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

from agents.runtime.store import DiskFull, Store
from agents.wire.sections.notify import Delivery, Notification

log = logging.getLogger("cetlab.notify")

KEEP_S = 7 * 86400  # delivered and dropped rows are kept this long (a week of history), then pruned at start
LOOK_AHEAD = 500  # a route's oldest pending rows among which the next due one is found

SCHEMA = [
    """CREATE TABLE notify_outbox (
        n INTEGER PRIMARY KEY AUTOINCREMENT,
        route TEXT NOT NULL,
        key TEXT NOT NULL,  -- one per firing, resolve or event: "<alert id>:firing", "job m5-3:failed"
        notification TEXT NOT NULL,  -- agents.wire.sections.notify.Notification as JSON
        created_at REAL NOT NULL, next_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        delivered_at REAL, dropped_at REAL, answer TEXT,
        UNIQUE (route, key))""",
    "CREATE INDEX notify_pending ON notify_outbox (route, delivered_at, dropped_at, n)",
    """CREATE TABLE notify_routes (
        route TEXT PRIMARY KEY, delivered INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
        dropped INTEGER NOT NULL DEFAULT 0, last_ok TEXT, last_failure TEXT)""",  # the last answers, as Delivery JSON
    "CREATE TABLE notify_meta (key TEXT PRIMARY KEY, value REAL NOT NULL)",
]


@dataclass(frozen=True)
class Pending:
    n: int
    route: str
    key: str
    notification: Notification
    created_at: float
    next_at: float
    attempts: int


class Outbox:
    """The queue's rows: put (once per key and route), the next due, delivered, failed (retry later), dropped."""

    def __init__(self, store: Store):
        self.store = store
        store.migrate("notify", SCHEMA)
        now = time.time()
        with store.transaction() as db:
            db.execute("INSERT OR IGNORE INTO notify_meta VALUES ('since', ?)", (now,))
            db.execute("DELETE FROM notify_outbox WHERE COALESCE(delivered_at, dropped_at) < ?", (now - KEEP_S,))
        self.since: float = store.query("SELECT value FROM notify_meta WHERE key='since'")[0]["value"]

    def put(self, route: str, key: str, notification: Notification, not_before: float = 0.0) -> bool | None:
        """Queue it for a route unless that route already has this key (a firing is sent once); `not_before`: held
        until then (a resolve waits out the flap hold, and may be taken back meanwhile: cancel).

        Returns True if queued now, False if it was already, None if state.db could not take it (try again later)."""
        try:
            with self.store.transaction() as db:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO notify_outbox (route, key, notification, created_at, next_at) VALUES (?, ?, ?, ?, ?)",
                    (route, key, notification.model_dump_json(), time.time(), not_before),
                )
                return cursor.rowcount == 1
        except DiskFull:
            log.error("notification %s for route %s not queued: state.db's disk is full", key, route)
            return None

    def cancel(self, route: str, key: str) -> bool:
        """Take back a row never tried (a held resolve of an alert that fired again): True if it was there."""
        with self.store.transaction() as db:
            cursor = db.execute(
                "DELETE FROM notify_outbox WHERE route=? AND key=? AND attempts=0 AND delivered_at IS NULL AND dropped_at IS NULL",
                (route, key),
            )
            return cursor.rowcount == 1

    def has(self, route: str, key: str) -> bool:
        return bool(self.store.query("SELECT 1 FROM notify_outbox WHERE route=? AND key=?", (route, key)))

    def next(self, route: str, now: float | None = None) -> Pending | None:
        """The route's next notification: the oldest one due, else the one due soonest.

        A row whose delivery failed waits for its own retry without holding the rows behind it (a notification its
        endpoint refuses held the rest of its route's for up to a day); only a row of the same alert stays behind it,
        so that an alert's resolve never overtakes its firing."""
        now = time.time() if now is None else now
        rows = self.store.query(
            "SELECT * FROM notify_outbox WHERE route=? AND delivered_at IS NULL AND dropped_at IS NULL ORDER BY n LIMIT ?",
            (route, LOOK_AHEAD),
        )
        if not rows:
            return None
        waiting: set[str] = set()  # alerts with a row ahead still pending
        ready = []
        for row in rows:
            alert = row["key"].rpartition(":")[0]
            if alert not in waiting:
                ready.append(row)
            waiting.add(alert)
        due = [row for row in ready if row["next_at"] <= now]
        r = due[0] if due else min(ready, key=lambda row: row["next_at"])
        try:
            notification = Notification.model_validate_json(r["notification"])
        except ValueError as exc:  # a row this version cannot read: dropped, said, never retried forever
            self.dropped(r["n"], route, Delivery(at=time.time(), ok=False, answer=f"unreadable queued notification: {exc}"[:300]))
            return self.next(route, now)
        return Pending(r["n"], route, r["key"], notification, r["created_at"], r["next_at"], r["attempts"])

    def pending_count(self, route: str) -> int:
        return int(
            self.store.query(
                "SELECT COUNT(*) AS c FROM notify_outbox WHERE route=? AND delivered_at IS NULL AND dropped_at IS NULL", (route,)
            )[0]["c"]
        )

    def delivered(self, n: int, route: str, answer: Delivery) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE notify_outbox SET delivered_at=?, attempts=attempts+1, answer=? WHERE n=?", (answer.at, answer.answer, n)
            )
            self._count(db, route, "delivered", "last_ok", answer)

    def failed(self, n: int, route: str, answer: Delivery, next_at: float) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE notify_outbox SET attempts=attempts+1, next_at=?, answer=? WHERE n=?", (next_at, answer.answer, n))
            self._count(db, route, "failures", "last_failure", answer)

    def dropped(self, n: int, route: str, answer: Delivery) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE notify_outbox SET dropped_at=?, answer=? WHERE n=?", (answer.at, answer.answer, n))
            self._count(db, route, "dropped", "last_failure", answer)

    def record(self, route: str, answer: Delivery) -> None:
        """An answer to a send that was not a queued row (an Alertmanager resend, a test)."""
        with self.store.transaction() as db:
            self._count(db, route, "delivered" if answer.ok else "failures", "last_ok" if answer.ok else "last_failure", answer)

    @staticmethod
    def _count(
        db: sqlite3.Connection,
        route: str,
        counter: Literal["delivered", "failures", "dropped"],
        last: Literal["last_ok", "last_failure"],
        answer: Delivery,
    ) -> None:
        # the column names are these literals only (never from input): the f-string below cannot inject
        db.execute("INSERT OR IGNORE INTO notify_routes (route) VALUES (?)", (route,))
        db.execute(f"UPDATE notify_routes SET {counter}={counter}+1, {last}=? WHERE route=?", (answer.model_dump_json(), route))

    def route_counts(self, route: str) -> dict[str, object]:
        rows = self.store.query("SELECT * FROM notify_routes WHERE route=?", (route,))
        if not rows:
            return {}
        r = rows[0]
        return {
            "delivered": r["delivered"],
            "failures": r["failures"],
            "dropped": r["dropped"],
            "last_delivery": json.loads(r["last_ok"]) if r["last_ok"] else None,
            "last_failure": json.loads(r["last_failure"]) if r["last_failure"] else None,
        }
