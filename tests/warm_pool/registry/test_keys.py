"""The controller's API key table: hashes only, versions, revocation by key, hash or prefix."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from tests.warm_pool.conftest import StateDb
from warm_pool.registry.keys import KeyStore


def test_a_key_is_stored_only_as_its_hash_and_each_change_moves_the_version(
        tmp_path: Path, state_db: StateDb) -> None:
    store = KeyStore(state_db())
    assert store.version == 0
    key, row = store.add("demo", "ci", now=10.0)
    assert row.hash == hashlib.sha256(key.encode()).hexdigest() and row.prefix == key[:9]
    if store.db.dialect == "sqlite":
        assert key.encode() not in (tmp_path / "registry.db").read_bytes()
    assert store.version == 1
    other, _ = store.add("demo")
    by_prefix = store.revoke(other[:9], now=20.0)
    assert by_prefix == 1 and store.version == 3
    assert store.revoke(key) == 1 and store.revoke(key) == 0 and store.version == 4
    table = store.table()
    assert table.version == 4 and all(k.revoked_at for k in table.keys)
    store.close()
    assert KeyStore(state_db()).table() == table  # it outlives the process


def test_revoking_by_hash_and_a_config_key(state_db: StateDb) -> None:
    store = KeyStore(state_db())
    key, row = store.add("demo")
    assert store.revoke(f"sha256:{row.hash}") == 1
    config_hash = hashlib.sha256(b"from-the-config").hexdigest()
    assert store.revoke("from-the-config") == 0  # unknown here, and not told it is a config key
    assert store.revoke("from-the-config", config_keys={config_hash: "demo"}) == 1
    revoked = {k.hash: k for k in store.table().keys if k.revoked_at}
    assert set(revoked) == {row.hash, config_hash} and revoked[config_hash].tenant == "demo"


def test_keys_of_an_older_ledger_are_taken_in_once(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / "usage.db")
    old.execute("CREATE TABLE api_keys (hash TEXT PRIMARY KEY, tenant TEXT NOT NULL, label TEXT, "
                "prefix TEXT NOT NULL, created_at REAL NOT NULL, revoked_at REAL)")
    old.execute("INSERT INTO api_keys VALUES (?, 'demo', NULL, 'thaw-abcd', 1.0, NULL)", ("a" * 64,))
    old.commit()
    old.close()
    store = KeyStore(tmp_path / "keys.db")
    assert store.import_legacy(tmp_path / "usage.db") == 1
    assert store.import_legacy(tmp_path / "usage.db") == 0
    assert [k.hash for k in store.table().keys] == ["a" * 64] and store.version == 1


def test_admin_keys_are_hashes_apart_from_the_tenants_table(state_db: StateDb) -> None:
    store = KeyStore(state_db())
    before = store.version
    key, row = store.add_admin("ci deploys")
    assert key.startswith("thawadmin-") and row.hash == hashlib.sha256(key.encode()).hexdigest()
    assert key.startswith(row.prefix) and len(row.prefix) < len(key)
    # Not a tenant's key: activators never see it, and the key table did not move.
    assert store.version == before and row.hash not in {k.hash for k in store.table().keys}
    other, _ = store.add_admin(None)
    assert store.revoke_admin("thawadmin-nope") == 0
    assert store.revoke_admin(row.prefix) == 1
    assert store.revoke_admin(f"sha256:{hashlib.sha256(other.encode()).hexdigest()}") == 1
    assert store.revoke_admin(key) == 0  # already revoked
    assert all(r.revoked_at is not None for r in store.admin_keys())
    # Another controller on the same database sees them.
    assert [r.label for r in KeyStore(state_db()).admin_keys()] == ["ci deploys", None]
