"""The controller's state database: a SQLite file (the embedded default) or PostgreSQL
(``state.backend: postgres``), behind one small interface so each store writes its SQL
once: ``?`` parameters, types both accept (TEXT, INTEGER, DOUBLE PRECISION), and
``INSERT ... ON CONFLICT``.

Every change is a transaction (:meth:`Db.write`): on SQLite ``BEGIN IMMEDIATE`` (one
writer per file), on PostgreSQL a transaction-scoped advisory lock, so the changes of
several controllers sharing one database are serialised too. A database shared by
several controllers is fenced (:attr:`Db.fence`, ``warm_pool.fencing``): each change
first checks, inside its transaction, that this controller still holds the leader's
lease, so one deposed but still running changes nothing. Reads see one snapshot
(:meth:`Db.read`). Schemas are versioned migrations per store (:meth:`Db.migrate`), each
applied once, in its own transaction.

Blocking: the controller calls it from threads, one call at a time (a lock).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

from thaw.private_files import open_private

Dialect = Literal["sqlite", "postgres"]
# The advisory lock every write transaction takes on PostgreSQL (any fixed number).
WRITE_LOCK = 7_454_163

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (component, version)
)"""


class StateUnavailable(RuntimeError):
    """The state database cannot be reached (PostgreSQL down): nothing was changed."""


class Tx:
    """Statements inside one transaction."""

    def __init__(self, db: Db) -> None:
        self._db = db

    @property
    def dialect(self) -> Dialect:
        return self._db.dialect

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the rows it changed."""
        cur = self._db._raw.execute(self._db.sql(sql), tuple(params))
        return int(cur.rowcount or 0)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for each of ``rows`` (a batch's lines), in one call."""
        if rows:
            self._db._raw.cursor().executemany(self._db.sql(sql), [tuple(r) for r in rows])

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._db._raw.execute(self._db.sql(sql), tuple(params))
        return [tuple(r) for r in cur.fetchall()]

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def version(self, table: str) -> int:
        """The counter in ``table`` (a one-row table with a ``version`` column, which a
        store's migration creates): what watchers compare to know a table changed."""
        row = self.one(f"SELECT version FROM {table}")  # noqa: S608 - a store's own table name
        assert row is not None, f"{table} has no row"
        return int(row[0])

    def bump(self, table: str) -> int:
        """Move the counter in ``table`` on by one; the new version."""
        self.execute(f"UPDATE {table} SET version = version + 1")  # noqa: S608
        return self.version(table)


class Db:
    def __init__(self, dialect: Dialect, target: str) -> None:
        self.dialect = dialect
        self.target = target
        self._lock = threading.Lock()
        self._raw: Any = None
        # Run first in every fenced write transaction (under its lock); raises to refuse
        # the change (``warm_pool.fencing.LeaseFence``). None: every change is admitted.
        self.fence: Callable[[Tx], None] | None = None
        self._connect()

    @classmethod
    def sqlite(cls, path: Path | None) -> Db:
        """A SQLite file (created 0600), or ``None``: in memory (tests)."""
        if path is not None:
            # Created 0600 in a 0700 directory; SQLite gives its -wal and -shm files the
            # database file's mode.
            os.close(open_private(path, os.O_CREAT | os.O_RDWR))
        return cls("sqlite", ":memory:" if path is None else str(path))

    @classmethod
    def postgres(cls, url: str) -> Db:
        return cls("postgres", url)

    def _connect(self) -> None:
        if self.dialect == "sqlite":
            self._raw = sqlite3.connect(self.target, timeout=30, isolation_level=None, check_same_thread=False)
            self._raw.execute("PRAGMA journal_mode=WAL")
            return
        import psycopg

        try:
            self._raw = psycopg.connect(self.target, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            raise StateUnavailable(f"cannot reach the state database: {exc}") from None

    # Statements sent by every database of this process (``thaw_pool_db_statements_total``:
    # the controller's cost in its database per turn, at fleet size).
    statements: ClassVar[int] = 0

    def sql(self, text: str) -> str:
        Db.statements += 1
        return text.replace("?", "%s") if self.dialect == "postgres" else text

    def close(self) -> None:
        with self._lock:
            if self._raw is not None:
                self._raw.close()

    @contextmanager
    def _tx(self, begin: str, lock: bool, fenced: bool = False) -> Iterator[Tx]:
        with self._lock:
            if self.dialect == "postgres" and (self._raw is None or self._raw.closed or self._raw.broken):
                self._connect()
            try:
                self._raw.execute(begin)
                if lock and self.dialect == "postgres":
                    self._raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            except Exception as exc:
                self._unavailable(exc)
                raise
            try:
                tx = Tx(self)
                if fenced and self.fence is not None:
                    self.fence(tx)
                yield tx
            except BaseException as exc:
                try:
                    self._raw.execute("ROLLBACK")
                except Exception:  # the connection itself failed: it is replaced on the next call
                    pass
                self._unavailable(exc)
                raise
            else:
                try:
                    self._raw.execute("COMMIT")
                except Exception as exc:
                    self._unavailable(exc)
                    raise

    def _unavailable(self, exc: BaseException) -> None:
        """A PostgreSQL that went away is :class:`StateUnavailable` (typed, not a message)."""
        if self.dialect == "postgres":
            import psycopg

            if isinstance(exc, psycopg.OperationalError):
                raise StateUnavailable(f"the state database failed: {exc}") from None

    def write(self, *, fenced: bool = True) -> Any:
        """A transaction that changes state (serialised with every other writer), refused
        by the fence when there is one (``fenced=False``: history, such as the decision
        log, which a deposed controller still records truthfully)."""
        return self._tx("BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN", lock=True, fenced=fenced)

    def read(self) -> Any:
        """A transaction that reads one snapshot."""
        return self._tx("BEGIN" if self.dialect == "sqlite" else "BEGIN ISOLATION LEVEL REPEATABLE READ",
                        lock=False)

    def migrate(self, component: str, migrations: Sequence[str]) -> int:
        """Apply ``component``'s migrations not applied yet (migration ``i`` is version
        ``i + 1``), each in its own transaction; the schema version now."""
        with self.write(fenced=False) as tx:
            tx.execute(MIGRATIONS_TABLE)
        for version, script in enumerate(migrations, start=1):
            with self.write(fenced=False) as tx:
                if tx.one("SELECT 1 FROM schema_migrations WHERE component = ? AND version = ?",
                          (component, version)):
                    continue
                for statement in (s.strip() for s in script.split(";")):
                    if statement:
                        tx.execute(statement)
                tx.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (component, version, time.time()))
        return len(migrations)
