"""The agent's SQLite state: WAL journal, one transaction per change, schemas per component; checked at open."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("cetlab.store")

# Written next to state.db when it is created: a state dir with this marker and no state.db lost its state.
CREATED_MARKER_SUFFIX = ".created"
_CORRUPT = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}


class StoreError(Exception):
    """state.db cannot be opened or written (a full disk, permissions); str() says what to do."""


class DiskFull(StoreError):
    """A write to state.db failed for want of space (SQLITE_FULL)."""


def _is_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL" or "disk is full" in str(exc)


def _write_failed(exc: sqlite3.Error) -> bool:
    """A write the disk refused: full (ENOSPC), or an I/O error (over quota, a file size limit, a failing disk)."""
    return _is_full(exc) or str(getattr(exc, "sqlite_errorname", "")).startswith("SQLITE_IOERR") or "disk I/O error" in str(exc)


def _is_corrupt(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", None) in _CORRUPT or "malformed" in str(exc) or "not a database" in str(exc)


class Store:
    """state.db, checked at open: a corrupt file is moved aside (`state.db.corrupt-<time>`) and a fresh one
    started, a lost one is said loudly; either way `notice` says what happened, for the log and the trail."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.notice: str | None = None  # set when the state was lost or moved aside at this start
        self.disk_full: str | None = None  # the last write that failed for want of space, said for consoles
        self.full_at: float | None = None  # when it failed (a full disk lets small writes through now and then)
        marker = path.with_name(path.name + CREATED_MARKER_SUFFIX)
        had_state = path.exists() and path.stat().st_size > 0
        if not had_state and marker.exists():
            created = marker.read_text(errors="replace").strip()[:40]
            aside = self._move_aside() if path.exists() else None
            # what happened first, the long paths last: a trail or a toast that cuts the line still says it
            self.notice = (
                f"{path.name} was {'empty' if aside else 'missing'}, jobs, ledger and audit trail start empty "
                f"(this agent kept its state there since {created}; {path})"
                + (f"; the empty file is at {aside}" if aside else "")
            )
        try:
            self.db = self._open_checked() if had_state else self._open()
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: {exc}; check free disk space and the state dir's permissions") from None
        if self.notice:
            log.critical("%s", self.notice)
        if not marker.exists():
            marker.write_text(time.strftime("%Y-%m-%d %H:%M:%S %Z") + "\n")

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        db.execute("PRAGMA busy_timeout=5000")
        self.path.chmod(0o600)
        return db

    def _open_checked(self) -> sqlite3.Connection:
        """Open an existing state.db; if SQLite finds it corrupt, move it aside and start a fresh one."""
        db = None
        try:
            db = self._open()
            result = db.execute("PRAGMA quick_check(5)").fetchall()
            problem = None if [tuple(r) for r in result] == [("ok",)] else "; ".join(str(r[0]) for r in result)[:300]
        except sqlite3.Error as exc:
            if not _is_corrupt(exc):
                raise
            problem = str(exc)
        if problem is None and db is not None:
            return db
        if db is not None:
            db.close()
        aside = self._move_aside()
        self.notice = (
            f"{self.path.name} was corrupt, jobs, ledger and audit trail start empty ({problem}); "
            f"moved aside to {aside} (`sqlite3 {aside} .recover` may save some of it)"
        )
        return self._open()

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():  # twice in one second: never overwrite an earlier one
            aside, n = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}"), n + 1
        for suffix in ("", "-wal", "-shm"):  # a WAL left behind would be replayed into the fresh file
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                source.rename(f"{aside}{suffix}")
        return aside

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
        """One write transaction; a full disk raises DiskFull (saying so) and records it in ``disk_full`` and ``full_at``."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            if not _write_failed(exc):
                raise
            if self.db.in_transaction:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:  # the rollback may fail the same way; SQLite has rolled back by itself then
                    pass
            if _is_full(exc):
                self.disk_full = f"disk full: {self.path} cannot be written ({exc}); free disk space on this machine"
            else:
                self.disk_full = (
                    f"disk full or failing: {self.path} cannot be written ({exc}); check the disk's free space, quota and health"
                )
            self.full_at = time.time()
            raise DiskFull(self.disk_full) from None

    def execute(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = ()) -> sqlite3.Cursor:
        return self.db.execute(sql, args)

    def query(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self.db.execute(sql, args).fetchall()]

    def close(self) -> None:
        self.db.close()
