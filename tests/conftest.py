"""Shared fixtures: a real SeaweedFS store for the session, the demo model, a config."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer
from thaw.embedded_store import EmbeddedStore, free_port
from thaw.objstore import S3Endpoint

BUCKET = "thaw-test"

# Every vLLM engine the tests start (in-process, through an agent or `thaw up`) runs
# beside other engines and CPU-bound processes on a few cores, where OpenMP's default
# of spinning while it waits starves them: two tiny-model engines at once on two cores
# took 25 s to start and 14.5 s to generate what one alone did in 10.5 s and 1.8 s;
# with waiting threads asleep, 9.2 s and 2.0 s (docs/DEVELOPING.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Lanes of scripts/test (pytest-xdist workers gw0, gw1, ...) pick listening ports from
# ranges of their own, and so do the servers they start (they inherit this).
if (_lane := os.environ.get("PYTEST_XDIST_WORKER", "")).startswith("gw"):
    _low = 10_000 + 5_000 * int(_lane[2:])
    os.environ["THAW_LISTEN_PORTS"] = f"{_low}-{_low + 5_000}"


@pytest.fixture(scope="session", autouse=True)
def _session_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """XDG_STATE_HOME for the session's fixtures (a `thaw up` a module starts): the `thaw up`
    records (thaw.cli.stack) never go to the real home."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
        yield


@pytest.fixture
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_STATE_HOME of this test (and of what it starts) in a directory of its own: it
    sees no `thaw up` record but its own."""
    path = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(path))
    return path


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStore]:
    """One SeaweedFS server for the whole session (it takes ~4 s to start, 2 s to stop)."""
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


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A new empty database of this test's own on the session's PostgreSQL."""
    return postgres.database(f"t_{uuid.uuid4().hex[:12]}")


def pytest_configure(config: pytest.Config) -> None:
    # The lanes' order is set below (``_lane_rank``), not by xdist's reordering of the
    # groups by their number of tests.
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lanes `scripts/test` runs the suite in (pytest-xdist, ``--dist loadgroup``).

    The tests that run a whole Thaw with real vLLM engines (``engine``) are one group,
    one after another as without xdist, so no two stacks compete for the CPU; it is
    handed out first. The other tests follow, a module at a time (its module-scoped
    fixtures set up once), larger modules first, in the lanes beside it. Last come the
    engine tests of a single worker or engine host (``engine-late:<module>``,
    :data:`LATE_ENGINE_TESTS`), a module at a time, each taken by whichever lane runs
    short of work first (xdist hands a lane more when it has two tests or fewer left).
    On two cores the engine group alone took 28 minutes and everything else 9 (run
    apart, on an idle machine): with every engine test in one lane that lane was the
    suite's length (32 minutes in CI) and the other stood idle for most of it. With the
    late tests one group the lanes were still uneven (32 minutes in CI again, as the
    engine group grew); as modules they fill whichever lane ends first.

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
    groups: dict[str, str] = {}  # node id (with its group) -> group
    for item in items:
        at = item.nodeid.rfind("@")
        if at > item.nodeid.rfind("]"):
            group = item.nodeid[at + 1:]  # grouped already
        else:
            group = _lane_group(item)
            item._id = coerce_node_id(f"{item.nodeid}@{group}")
        groups[item.nodeid] = group
    sizes = Counter(groups.values())
    # A stable sort: the order within a group stays as collected (or as shuffled).
    items.sort(key=lambda i: _lane_rank(groups[i.nodeid], sizes[groups[i.nodeid]]))


# Engine tests of one worker or one engine host, not a fleet of them: they run last, a
# module at a time, beside the engine group's last stacks.
LATE_ENGINE_TESTS = ("tests/worker/", "tests/loadtests/test_bench_cold_start.py", "tests/test_e2e_quickstart.py")


def _lane_group(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0]
    if not item.get_closest_marker("engine"):
        return module
    return f"engine-late:{module}" if module.startswith(LATE_ENGINE_TESTS) else "engine"


def _lane_rank(group: str, size: int) -> tuple[int, int]:
    return (0, 0) if group == "engine" else (2, -size) if group.startswith("engine-late:") else (1, -size)


# What each lane spent, by group, and when it ended: printed at the end of a run in lanes
# (the suite's length is its longest lane's; docs/DEVELOPING.md).
_LANES: dict[str, dict[str, float]] = {}
_LANE_ENDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set on the controller, for a lane's report
    if node is None:
        return
    import time

    lane = node.gateway.id
    at = report.nodeid.rfind("@")
    group = report.nodeid[at + 1:] if at > report.nodeid.rfind("]") else "?"
    group = "engine-late" if group.startswith("engine-late:") else group if group == "engine" else "other"
    lanes = _LANES.setdefault(lane, {})
    lanes[group] = lanes.get(group, 0.0) + report.duration
    _LANE_ENDS[lane] = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _LANES:
        return
    first = min(_LANE_ENDS.values())
    terminalreporter.write_sep("=", "lanes (seconds in tests, by group)")
    for lane in sorted(_LANES):
        groups = ", ".join(f"{g} {s:.0f}" for g, s in sorted(_LANES[lane].items()))
        terminalreporter.write_line(f"{lane}: {sum(_LANES[lane].values()):.0f} in all ({groups}); "
                                    f"its last test ended {_LANE_ENDS[lane] - first:.0f} s after the first lane's")
