"""The API key table, kept by the controller (`thaw tenants keys add|revoke|ls` talk to it).

Keys exist here only as sha256 hashes, in ``<data_dir>/controller/keys.db`` (SQLite,
mode 0600), or in the PostgreSQL of ``state.backend: postgres``. Every change bumps the
table's ``version``; the controller puts that version in the route table its activators
long-poll, and an activator that sees a new version fetches the table (``GET /v1/keys``),
so a key works, or stops working, on every activator within a second. Tenants themselves (allowed models, limits) are the
registry's (``warm_pool.registry.tenants``); a key from the config can be revoked here too.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import time
from pathlib import Path

from thaw.wire import AdminKey, ApiKey, KeyTable
from warm_pool.db import Db, Tx

KEYS_FILE = "keys.db"
KEY_PREFIX = "thaw-"
# Admin keys (the controller's /v1/admin/ API, never a model's) look different.
ADMIN_KEY_PREFIX = "thawadmin-"
SHOWN_PREFIX_LEN = 9

MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    label TEXT,
    prefix TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS key_version ("only" INTEGER PRIMARY KEY CHECK ("only" = 1), version INTEGER NOT NULL);
INSERT INTO key_version VALUES (1, 0) ON CONFLICT DO NOTHING
""",
    """
CREATE TABLE IF NOT EXISTS admin_keys (
    hash TEXT PRIMARY KEY,
    label TEXT,
    prefix TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
)
""",
]
# api_keys.hash: the sha256 hex of the key; prefix: its first characters, to recognise it
# in listings.


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The key table in the controller's state database (``warm_pool.db``): a SQLite file
    of its own (``None``: in memory, for tests) or the PostgreSQL the registry is in.
    Blocking: the controller calls it from threads."""

    def __init__(self, where: Path | Db | None) -> None:
        self.db = where if isinstance(where, Db) else Db.sqlite(where)
        self.db.migrate("keys", MIGRATIONS)

    def close(self) -> None:
        self.db.close()

    @property
    def version(self) -> int:
        with self.db.read() as tx:
            return self._version(tx)

    @staticmethod
    def _version(tx: Tx) -> int:
        return tx.version("key_version")

    @staticmethod
    def _bump(tx: Tx) -> None:
        tx.bump("key_version")

    def add(self, tenant: str, label: str | None = None, *, now: float | None = None) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: the key itself (shown once, never stored) and its row."""
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        row = ApiKey(hash=_digest(key), tenant=tenant, label=label, prefix=key[:SHOWN_PREFIX_LEN],
                     created_at=time.time() if now is None else now)
        with self.db.write() as tx:
            tx.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                       (row.hash, row.tenant, row.label, row.prefix, row.created_at))
            self._bump(tx)
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
        with self.db.write() as tx:
            for c in sorted(candidates):
                n += tx.execute("UPDATE api_keys SET revoked_at = ? WHERE hash = ? AND revoked_at IS NULL", (now, c))
            if n == 0 and key_or_hash.startswith(KEY_PREFIX) and len(key_or_hash) <= SHOWN_PREFIX_LEN + 3:
                n = tx.execute("UPDATE api_keys SET revoked_at = ? WHERE prefix = ? AND revoked_at IS NULL",
                               (now, key_or_hash))
            if n == 0:
                for c in sorted(candidates & set(config_keys or {})):
                    n += tx.execute("INSERT INTO api_keys VALUES (?, ?, 'config', '', ?, ?) ON CONFLICT DO NOTHING",
                                    (c, (config_keys or {})[c], now, now))
            if n:
                self._bump(tx)
        return n

    def revoke_tenant(self, tenant: str, *, now: float | None = None) -> int:
        """Revoke every active key of ``tenant`` (it was removed); how many."""
        with self.db.write() as tx:
            n = tx.execute("UPDATE api_keys SET revoked_at = ? WHERE tenant = ? AND revoked_at IS NULL",
                           (time.time() if now is None else now, tenant))
            if n:
                self._bump(tx)
        return n

    def table(self) -> KeyTable:
        with self.db.read() as tx:
            version = self._version(tx)
            rows = tx.query("SELECT hash, tenant, label, prefix, created_at, revoked_at FROM api_keys "
                            "ORDER BY created_at, hash")
        return KeyTable(version=version, keys=[
            ApiKey(hash=h, tenant=t, label=lb, prefix=p, created_at=c, revoked_at=r) for h, t, lb, p, c, r in rows])

    # -- admin keys: the model and tenant API (/v1/admin/) without the cluster token ------
    def add_admin(self, label: str | None = None, *, now: float | None = None) -> tuple[str, AdminKey]:
        key = ADMIN_KEY_PREFIX + secrets.token_urlsafe(24)
        row = AdminKey(hash=_digest(key), label=label, prefix=key[:len(ADMIN_KEY_PREFIX) + 4],
                       created_at=time.time() if now is None else now)
        with self.db.write() as tx:
            tx.execute("INSERT INTO admin_keys VALUES (?, ?, ?, ?, NULL)",
                       (row.hash, row.label, row.prefix, row.created_at))
        return key, row

    def revoke_admin(self, key_or_hash: str, *, now: float | None = None) -> int:
        """Revoke an admin key by the key, its sha256, or its listed prefix; how many."""
        now = time.time() if now is None else now
        h = key_or_hash.removeprefix("sha256:")
        with self.db.write() as tx:
            return sum(tx.execute(f"UPDATE admin_keys SET revoked_at = ? WHERE {column} = ? AND revoked_at IS NULL",
                                  (now, value))
                       for column, value in (("hash", _digest(key_or_hash)), ("hash", h), ("prefix", key_or_hash)))

    def admin_keys(self) -> list[AdminKey]:
        with self.db.read() as tx:
            rows = tx.query("SELECT hash, label, prefix, created_at, revoked_at FROM admin_keys "
                            "ORDER BY created_at, hash")
        return [AdminKey(hash=h, label=lb, prefix=p, created_at=c, revoked_at=r) for h, lb, p, c, r in rows]

    def import_legacy(self, path: Path) -> int:
        """Take in the keys an older Thaw kept beside its ledger (``<data_dir>/usage.db``),
        once, when this table is still empty; how many rows came."""
        if not path.exists():
            return 0
        with self.db.read() as tx:
            if (tx.one("SELECT count(*) FROM api_keys") or (0,))[0]:
                return 0
        old = sqlite3.connect(path, timeout=30)
        try:
            if not old.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='api_keys'").fetchone():
                return 0
            rows = old.execute("SELECT hash, tenant, label, prefix, created_at, revoked_at FROM api_keys").fetchall()
        finally:
            old.close()
        if rows:
            with self.db.write() as tx:
                for r in rows:
                    tx.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", r)
                self._bump(tx)
        return len(rows)
