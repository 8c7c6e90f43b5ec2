"""The API key table, kept by the controller (`thaw tenants add|revoke|ls` talk to it).

Keys exist here only as sha256 hashes, in ``<data_dir>/controller/keys.db`` (SQLite,
mode 0600). Every change bumps the table's ``version``; the controller puts that version
in the route table its activators long-poll, and an activator that sees a new version
fetches the table (``GET /v1/keys``), so a key works, or stops working, on every
activator within a second. Tenants themselves (allowed models, limits) are the
registry's (``warm_pool.tenants``); a key from the config can be revoked here too.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from thaw.private_files import open_private
from thaw.wire import ApiKey, KeyTable

KEYS_FILE = "keys.db"
KEY_PREFIX = "thaw-"
SHOWN_PREFIX_LEN = 9

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,          -- sha256 hex of the key
    tenant TEXT NOT NULL,
    label TEXT,
    prefix TEXT NOT NULL,           -- first characters, to recognise a key in listings
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE TABLE IF NOT EXISTS key_version (only INTEGER PRIMARY KEY CHECK (only = 1), version INTEGER NOT NULL);
INSERT OR IGNORE INTO key_version VALUES (1, 0);
"""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The key table in one SQLite file (``None``: in memory, for tests). Blocking: the
    controller calls it from threads, one call at a time (a lock)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            # Created 0600 (an older, looser file narrowed): hashes are not keys, but
            # nobody else needs to read them. SQLite gives its -wal and -shm files the
            # database file's mode.
            os.close(open_private(path, os.O_CREAT | os.O_RDWR))
        self._conn = sqlite3.connect(":memory:" if path is None else path, timeout=30, isolation_level=None,
                                     check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    @property
    def version(self) -> int:
        with self._lock:
            return self._version()

    def _version(self) -> int:
        return int(self._conn.execute("SELECT version FROM key_version").fetchone()[0])

    def _bump(self) -> None:
        self._conn.execute("UPDATE key_version SET version = version + 1")

    def add(self, tenant: str, label: str | None = None, *, now: float | None = None) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: the key itself (shown once, never stored) and its row."""
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        row = ApiKey(hash=_digest(key), tenant=tenant, label=label, prefix=key[:SHOWN_PREFIX_LEN],
                     created_at=time.time() if now is None else now)
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                               (row.hash, row.tenant, row.label, row.prefix, row.created_at))
            self._bump()
        return key, row

    def revoke(self, key_or_hash: str, *, config_keys: dict[str, str] | None = None, now: float | None = None) -> int:
        """Revoke by the key itself, its sha256 (hex or 'sha256:hex'), or a listed prefix;
        how many keys were revoked. A key of the config file (``config_keys``: hash hex ->
        tenant) is recorded as revoked, so it stops working too."""
        now = time.time() if now is None else now
        h = key_or_hash.removeprefix("sha256:")
        candidates = {_digest(key_or_hash)}
        if len(h) == 64 and all(c in "0123456789abcdef" for c in h):
            candidates.add(h)
        n = 0
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            for c in candidates:
                n += self._conn.execute("UPDATE api_keys SET revoked_at = ? WHERE hash = ? AND revoked_at IS NULL",
                                        (now, c)).rowcount
            if n == 0 and key_or_hash.startswith(KEY_PREFIX) and len(key_or_hash) <= SHOWN_PREFIX_LEN + 3:
                n = self._conn.execute("UPDATE api_keys SET revoked_at = ? WHERE prefix = ? AND revoked_at IS NULL",
                                       (now, key_or_hash)).rowcount
            if n == 0:
                for c in candidates & set(config_keys or {}):
                    n += self._conn.execute("INSERT OR IGNORE INTO api_keys VALUES (?, ?, 'config', '', ?, ?)",
                                            (c, (config_keys or {})[c], now, now)).rowcount
            if n:
                self._bump()
        return n

    def revoke_tenant(self, tenant: str, *, now: float | None = None) -> int:
        """Revoke every active key of ``tenant`` (it was removed); how many."""
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            n = self._conn.execute("UPDATE api_keys SET revoked_at = ? WHERE tenant = ? AND revoked_at IS NULL",
                                   (time.time() if now is None else now, tenant)).rowcount
            if n:
                self._bump()
        return int(n)

    def table(self) -> KeyTable:
        with self._lock, self._conn:
            self._conn.execute("BEGIN")
            version = self._version()
            rows = self._conn.execute(
                "SELECT hash, tenant, label, prefix, created_at, revoked_at FROM api_keys ORDER BY created_at"
            ).fetchall()
        return KeyTable(version=version, keys=[
            ApiKey(hash=h, tenant=t, label=lb, prefix=p, created_at=c, revoked_at=r) for h, t, lb, p, c, r in rows])

    def import_legacy(self, path: Path) -> int:
        """Take in the keys an older Thaw kept beside its ledger (``<data_dir>/usage.db``),
        once, when this table is still empty; how many rows came."""
        if not path.exists() or self._conn.execute("SELECT count(*) FROM api_keys").fetchone()[0]:
            return 0
        old = sqlite3.connect(path, timeout=30)
        try:
            if not old.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='api_keys'").fetchone():
                return 0
            rows = old.execute("SELECT hash, tenant, label, prefix, created_at, revoked_at FROM api_keys").fetchall()
        finally:
            old.close()
        if rows:
            with self._lock, self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.executemany("INSERT OR IGNORE INTO api_keys VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._bump()
        return len(rows)
