"""The agent's SQLite state: WAL journal, one transaction per change, schemas per component."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


class Store:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        self.db.execute("PRAGMA busy_timeout=5000")
        path.chmod(0o600)

    def migrate(self, component: str, statements: list[str]) -> None:
        """Apply a component's schema statements not applied yet (append-only list)."""
        self.db.execute("CREATE TABLE IF NOT EXISTS schema_version (component TEXT PRIMARY KEY, version INTEGER)")
        row = self.db.execute("SELECT version FROM schema_version WHERE component=?", (component,)).fetchone()
        done = row[0] if row else 0
        with self.transaction():
            for statement in statements[done:]:
                self.db.execute(statement)
            self.db.execute("INSERT OR REPLACE INTO schema_version VALUES (?, ?)", (component, len(statements)))

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def execute(self, sql: str, args: tuple | dict = ()) -> sqlite3.Cursor:
        return self.db.execute(sql, args)

    def query(self, sql: str, args: tuple | dict = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self.db.execute(sql, args).fetchall()]

    def close(self) -> None:
        self.db.close()
