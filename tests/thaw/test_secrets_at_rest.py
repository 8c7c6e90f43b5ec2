"""Secrets at rest: API keys exist on disk only as hashes, and every file Thaw writes
with a secret in it is 0600 in a directory nobody else may write to, whatever the
umask (thaw.private_files)."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from activator.keys import KeyCache
from thaw.auth import cluster_token, token_file
from thaw.cli.up import DEMO_API_KEY, _demo_key, endpoint_file, write_endpoint_file
from thaw.config import ThawConfig, hash_api_key, parse_config
from thaw.embedded_store import EmbeddedStore
from thaw.log import setup_logging
from thaw.private_files import UnsafeDirectory, ensure_private_dir, write_private
from thaw.wire import KeyTable
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.registry.keys import KeyStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
TOKEN = "secrets-test-cluster-token"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask0() -> Iterator[None]:
    """The loosest umask there is: a file's mode must come from how it was created."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def config(data_dir: Path) -> ThawConfig:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(data_dir)
    return parse_config(data)


# -- 0600, whatever the umask ------------------------------------------------------------


def test_the_cluster_token_is_0600_in_a_private_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    umask0: None) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    monkeypatch.delenv("THAW_CLUSTER_TOKEN_SSM_PARAMETER", raising=False)
    cfg = config(tmp_path / "new" / "data")
    cluster_token(cfg)
    assert mode(token_file(cfg)) == 0o600
    # The directories it made are the owner's alone (0777 under umask 0 otherwise).
    assert mode(cfg.data_dir) == 0o700 and mode(cfg.data_dir.parent) == 0o700


def test_the_store_credentials_and_identities_are_0600(tmp_path: Path, umask0: None) -> None:
    store = EmbeddedStore(tmp_path / "data" / "store", s3_port=9, bucket="thaw")
    access, secret = store.credentials()
    ids = store.write_identities(access, secret)
    assert mode(store.root / "credentials.json") == 0o600 and mode(ids) == 0o600
    assert secret.encode() in ids.read_bytes()  # (it does hold the secret)
    assert mode(store.root) == 0o700
    assert sorted(p.name for p in store.root.iterdir()) == ["credentials.json", "s3-identities.json"]  # no temps


def test_the_identities_file_is_0600_even_over_an_older_readable_one(tmp_path: Path, umask0: None) -> None:
    store = EmbeddedStore(tmp_path / "store", s3_port=9, bucket="thaw")
    store.root.mkdir()
    (store.root / "s3-identities.json").write_text("{}")
    os.chmod(store.root / "s3-identities.json", 0o644)
    assert mode(store.write_identities("a", "s")) == 0o600


def test_the_activators_key_cache_is_0600(tmp_path: Path, umask0: None) -> None:
    cache = KeyCache(tmp_path / "activators" / "a1")
    cache.save(KeyTable(version=1, keys=[]))
    assert mode(cache.path) == 0o600 and mode(cache.path.parent) == 0o700
    os.chmod(cache.path, 0o644)  # one an older Thaw left readable
    cache.save(KeyTable(version=2, keys=[]))
    assert mode(cache.path) == 0o600 and cache.load() == KeyTable(version=2, keys=[])


def test_the_controllers_key_table_and_its_wal_are_0600(tmp_path: Path, umask0: None) -> None:
    store = KeyStore(tmp_path / "controller" / "keys.db")
    store.add("demo")
    files = sorted(p.name for p in (tmp_path / "controller").iterdir())
    assert files == ["keys.db", "keys.db-shm", "keys.db-wal"]
    assert {f: mode(tmp_path / "controller" / f) for f in files} == dict.fromkeys(files, 0o600)
    assert mode(tmp_path / "controller") == 0o700
    store.close()


def test_an_older_readable_key_table_is_narrowed_to_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    KeyStore(path).close()
    os.chmod(path, 0o644)
    KeyStore(path).close()
    assert mode(path) == 0o600


def test_thaw_ups_endpoint_file_is_0600(tmp_path: Path, umask0: None) -> None:
    cfg = config(tmp_path / "data")
    path = write_endpoint_file(cfg, {"base_url": "http://127.0.0.1:8000/v1", "api_key": _demo_key(cfg)})
    assert path == endpoint_file(cfg) and mode(path) == 0o600 and mode(cfg.data_dir) == 0o700


def test_a_world_writable_directory_of_ours_loses_that_bit(tmp_path: Path, umask0: None) -> None:
    d = tmp_path / "shared"
    d.mkdir(mode=0o777)
    write_private(d / "secret", b"x")
    assert mode(d) == 0o775 and mode(d / "secret") == 0o600


def test_a_world_writable_directory_of_someone_else_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "theirs"
    d.mkdir()
    os.chmod(d, 0o777)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(d).st_uid + 1)  # as if it were not ours
    with pytest.raises(UnsafeDirectory, match="writable by anyone"):
        ensure_private_dir(d)


# -- API keys only as hashes ----------------------------------------------------------


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _sqlite_values(path: Path) -> list[str]:
    """Every value of every table of a SQLite file, as text."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out: list[str] = []
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            for row in con.execute(f"SELECT * FROM {table}"):  # noqa: S608 (names from sqlite_master)
                out.extend(str(v) for v in row)
        return out
    finally:
        con.close()


async def test_keys_created_with_thaw_tenants_exist_on_disk_only_as_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("THAW_CLUSTER_TOKEN", raising=False)
    cfg = config(tmp_path / "data")
    setup_logging("controller", "debug")  # everything logged is captured and scanned too
    # The controller as `thaw controller` builds it: its state under data_dir/controller.
    manager = build_pool(cfg, {}, HttpWorkerControl(TOKEN), state_dir=cfg.data_dir / "controller")
    app = create_pool_app(manager, TOKEN, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://controller",
                                 headers={"Authorization": f"Bearer {TOKEN}", "x-thaw-actor": "ops"}) as http:
        # `thaw tenants keys add demo`, twice; the second key is revoked by the key itself.
        keys = []
        for label in ("ci", "laptop"):
            r = await http.post("/v1/keys", json={"tenant": "demo", "label": label})
            assert r.status_code == 201, r.text
            keys.append(r.json()["key"])  # shown once, to the operator who asked
        r = await http.post("/v1/keys/revoke", json={"key": keys[1]})
        assert r.status_code == 200 and r.json()["revoked"] == 1
        table = KeyTable.model_validate((await http.get("/v1/keys")).json())
    # An activator receives the table and keeps it on its disk.
    KeyCache(cfg.activator_dir("a1")).save(table)
    cluster_token(cfg)
    write_endpoint_file(cfg, {"api_key": _demo_key(cfg)})
    manager.parts.key_admin.keys.close()
    logs = cfg.data_dir / "logs" / "captured.log"
    logs.parent.mkdir(parents=True, exist_ok=True)
    captured = capsys.readouterr()
    logs.write_text(captured.out + captured.err)
    assert "pool_event" in logs.read_text()  # the key events were logged, and scanned below

    files = _files(cfg.data_dir)
    assert {"keys.db", "keys.json", "cluster-token", "endpoint.json", "captured.log"} <= {p.name for p in files}
    for key in keys:
        assert key.startswith("thaw-")
        secret_part = key.removeprefix("thaw-").encode()
        for p in files:
            assert secret_part not in p.read_bytes(), f"{p} holds an API key in plaintext"
        for db in cfg.data_dir.rglob("*.db"):
            assert not any(key in v or key.removeprefix("thaw-") in v for v in _sqlite_values(db)), db
        # What is there is its hash.
        assert hash_api_key(key).removeprefix("sha256:") in {k.hash for k in table.keys}
    # The one key endpoint.json may hold is the documented demo key, whose hash the
    # config lists (printed for the user by `thaw up`); 0600 all the same.
    assert _demo_key(cfg) == DEMO_API_KEY
    assert mode(endpoint_file(cfg)) == 0o600


def test_the_config_takes_keys_only_as_hashes() -> None:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data["tenants"][0]["api_key_hashes"] = ["thaw-a-plaintext-key"]
    with pytest.raises(Exception, match="api_key_hashes"):
        parse_config(data)
