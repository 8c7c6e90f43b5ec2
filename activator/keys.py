"""API keys added and revoked at run time (`thaw tenants add|revoke|ls`).

Keys live in the same SQLite file as the ledger, only as sha256 hashes. The activator
re-reads the table every second, so a key works (or stops working) without a restart.
Tenants themselves (allowed models, limits) come from the config file; a key from
config can be revoked here too.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,          -- sha256 hex of the key
    tenant TEXT NOT NULL,
    label TEXT,
    prefix TEXT NOT NULL,           -- first characters, to recognise a key in listings
    created_at REAL NOT NULL,
    revoked_at REAL
);
"""


@dataclass(frozen=True)
class KeyRow:
    hash: str
    tenant: str
    label: str | None
    prefix: str
    created_at: float
    revoked_at: float | None


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


def add_key(path: Path, tenant: str, label: str | None = None) -> str:
    """Create a key for ``tenant`` and return it: the only time it is ever shown."""
    key = "thaw-" + secrets.token_urlsafe(24)
    conn = _connect(path)
    try:
        conn.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                     (hashlib.sha256(key.encode()).hexdigest(), tenant, label, key[:9], time.time()))
    finally:
        conn.close()
    return key


def revoke(path: Path, key_or_hash: str, tenant_of_config_key: str | None = None) -> int:
    """Revoke by the key itself, its sha256 (hex or 'sha256:hex'), or a listed prefix.

    Returns how many keys were revoked. A config key's hash is recorded as revoked
    (its tenant given by the caller), so it stops working too.
    """
    h = key_or_hash.removeprefix("sha256:")
    candidates = {hashlib.sha256(key_or_hash.encode()).hexdigest()}
    if len(h) == 64 and all(c in "0123456789abcdef" for c in h):
        candidates.add(h)
    conn = _connect(path)
    try:
        now = time.time()
        n = 0
        for c in candidates:
            n += conn.execute("UPDATE api_keys SET revoked_at = ? WHERE hash = ? AND revoked_at IS NULL",
                              (now, c)).rowcount
        if n == 0 and key_or_hash.startswith("thaw-") and len(key_or_hash) <= 12:
            n = conn.execute("UPDATE api_keys SET revoked_at = ? WHERE prefix = ? AND revoked_at IS NULL",
                             (now, key_or_hash)).rowcount
        if n == 0 and tenant_of_config_key is not None:
            for c in candidates:
                conn.execute("INSERT OR IGNORE INTO api_keys VALUES (?, ?, 'config', '', ?, ?)",
                             (c, tenant_of_config_key, now, now))
                n += 1
        return n
    finally:
        conn.close()


def list_keys(path: Path) -> list[KeyRow]:
    if not path.exists():
        return []
    conn = _connect(path)
    try:
        return [KeyRow(*r) for r in conn.execute(
            "SELECT hash, tenant, label, prefix, created_at, revoked_at FROM api_keys ORDER BY created_at")]
    finally:
        conn.close()


def snapshot(path: Path) -> tuple[dict[bytes, str], set[bytes]]:
    """(active key hash -> tenant, revoked hashes), for the authenticator."""
    active: dict[bytes, str] = {}
    revoked: set[bytes] = set()
    for row in list_keys(path):
        (revoked.add(bytes.fromhex(row.hash)) if row.revoked_at else
         active.__setitem__(bytes.fromhex(row.hash), row.tenant))
    return active, revoked
