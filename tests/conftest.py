"""Shared fixtures: a real SeaweedFS store for the session, the demo model, a config."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint

BUCKET = "thaw-test"

# Lanes of scripts/test (pytest-xdist workers gw0, gw1, ...) pick listening ports from
# ranges of their own, and so do the servers they start (they inherit this).
if (_lane := os.environ.get("PYTEST_XDIST_WORKER", "")).startswith("gw"):
    _low = 10_000 + 5_000 * int(_lane[2:])
    os.environ["THAW_LISTEN_PORTS"] = f"{_low}-{_low + 5_000}"


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStore]:
    """One SeaweedFS server for the whole session (it takes ~4 s to start, ~16 s to stop)."""
    root = tmp_path_factory.mktemp("store")
    s = EmbeddedStore(root, s3_port=free_port(), bucket=BUCKET)
    s.start(timeout_s=90)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def s3(store: EmbeddedStore) -> S3Endpoint:
    return store.endpoint()


@pytest.fixture
def s3_prefix(request: pytest.FixtureRequest) -> str:
    """A fresh s3:// prefix per test so tests never see each other's objects."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:60]
    return f"s3://{BUCKET}/tests/{name}-{os.getpid()}-{free_port()}"


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from thaw.demo_model import build_demo_model

    out = tmp_path_factory.mktemp("demo") / "demo"
    build_demo_model(out)
    return out


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session (tests/postgres_server.py); each test makes its own
    database in it (``postgres.database(name)``)."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.remove()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lanes `scripts/test` runs the suite in (pytest-xdist, ``--dist loadgroup``):
    every test that starts a real vLLM engine in one lane, one after another as without
    xdist, so no two engines' start-ups compete for the CPU; the other tests, a module at
    a time (its module-scoped fixtures set up once), in the lanes beside it. On two cores
    the engine lane is the suite's length (33 minutes); the other lane ends earlier.

    The group is the nodeid's ``@`` suffix, which xdist's scheduler reads. xdist 3.8 adds
    it from ``xdist_group`` marks by setting ``item._nodeid``, which pytest 9 no longer
    reads (a node's id is ``item._id``), so it is set here, after xdist's own hook.

    Schemathesis gives each API operation's item its function's node id (the
    operation is only in ``item.name``); xdist runs one item per node id, so each is
    given its name's id first (``test_worker_api[GET /healthz]``)."""
    from _pytest.nodeid import coerce_node_id

    for item in items:
        parent, _, leaf = item.nodeid.rpartition("::")
        if parent and "[" in item.name and "[" not in leaf and item.name.startswith(leaf):
            item._id = coerce_node_id(f"{parent}::{item.name}")
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.nodeid.rfind("@") > item.nodeid.rfind("]"):
            continue  # grouped already
        item._id = coerce_node_id(f"{item.nodeid}@{_lane_group(item)}")


def _lane_group(item: pytest.Item) -> str:
    # One engine lane: the single-worker engine tests as a group of their own in the
    # other lane (beside its modules) took 48:53 against 47:18; two engines at once on
    # two cores each ran slower by what the split saved.
    return "engine" if item.get_closest_marker("engine") else item.nodeid.split("::", 1)[0]
