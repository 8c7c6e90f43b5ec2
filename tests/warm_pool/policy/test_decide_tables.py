"""The placement arithmetic of ``warm_pool.policy.decide`` as tables: each row a worker's
copies and measured rates, and the seconds and tier the policy expects, written out as
the sum it computes (bytes / rate per tier, plus an engine build or teardown)."""

from __future__ import annotations

import pytest

from thaw.wire import CachedWeights
from warm_pool.policy.decide import (
    DEFAULT_LOAD_BYTES_PER_S,
    ENGINE_BUILD_S,
    ENGINE_TEARDOWN_S,
    WorkerView,
    expected_load,
    expected_start,
    launch_backoff_s,
    place,
)

URI = "s3://thaw/models/m"
GB = 10**9
HOST, DISK, S3 = (DEFAULT_LOAD_BYTES_PER_S[t] for t in ("host", "disk", "s3"))


def worker(wid: str = "w", *, host: int = 0, disk: int = 0, rates: tuple[tuple[str, float], ...] = (),
           prebuilt: str | None = None, ready: bool = False, total: int = 4 * GB) -> WorkerView:
    cached = tuple(CachedWeights(uri=URI, tier=t, bytes=b, total_bytes=total)  # type: ignore[arg-type]
                   for t, b in (("host", host), ("disk", disk)) if b)
    return WorkerView(wid, "gpu", "standby", cached=cached, load_rates=rates,  # type: ignore[arg-type]
                      prebuilt_class=prebuilt, prebuilt_ready=ready)


# (what, worker, expected seconds, slowest tier read)
LOADS = [
    ("nothing held: all from the store", worker(), 4 * GB / S3, "s3"),
    ("all in memory", worker(host=4 * GB), 4 * GB / HOST, "host"),
    ("all on disk", worker(disk=4 * GB), 4 * GB / DISK, "disk"),
    # Both copies are the model's first bytes: the disk copy counts only beyond the
    # host copy, and the rest comes from the store.
    ("1 GB in memory, all 4 GB on disk", worker(host=GB, disk=4 * GB), GB / HOST + 3 * GB / DISK, "disk"),
    ("1 GB in memory, 3 GB on disk", worker(host=GB, disk=3 * GB), GB / HOST + 2 * GB / DISK + GB / S3, "s3"),
    ("half on disk", worker(disk=2 * GB), 2 * GB / DISK + 2 * GB / S3, "s3"),
    # A measured rate replaces the default; a zero (never measured) does not.
    ("the store measured at 0.5 GB/s", worker(rates=(("s3", 0.5e9),)), 4 * GB / 0.5e9, "s3"),
    ("a rate of zero is no measurement", worker(rates=(("s3", 0.0),)), 4 * GB / S3, "s3"),
    ("more held than the model (an older copy)", worker(host=8 * GB), 4 * GB / HOST, "host"),
]


@pytest.mark.parametrize(("worker_", "seconds", "tier"), [r[1:] for r in LOADS], ids=[r[0] for r in LOADS])
def test_expected_load(worker_: WorkerView, seconds: float, tier: str) -> None:
    got_s, got_tier = expected_load(worker_, URI, 4 * GB)
    assert got_s == pytest.approx(seconds) and got_tier == tier


def test_a_model_of_unknown_size_is_read_from_the_store_in_no_time() -> None:
    assert expected_load(worker(host=GB), URI, 0) == (0.0, "s3")


LOAD = 4 * GB / S3
# (what, worker, engine class of the model, expected seconds, tier)
STARTS = [
    ("no engine kept: build one, then load", worker(), "a", LOAD + ENGINE_BUILD_S, "s3"),
    ("its class built: a swap moves the weights only", worker(prebuilt="a", ready=True), "a", LOAD, "swap"),
    ("its class still building: the build's cost", worker(prebuilt="a"), "a", LOAD + ENGINE_BUILD_S, "s3"),
    ("another class kept: stop it, build, load", worker(prebuilt="b", ready=True), "a",
     LOAD + ENGINE_TEARDOWN_S + ENGINE_BUILD_S, "s3"),
    ("a model of no class on a kept engine", worker(prebuilt="b", ready=True), None,
     LOAD + ENGINE_TEARDOWN_S + ENGINE_BUILD_S, "s3"),
    ("swap with the weights in memory", worker(prebuilt="a", ready=True, host=4 * GB), "a", 4 * GB / HOST, "swap"),
]


@pytest.mark.parametrize(("worker_", "cls", "seconds", "tier"), [r[1:] for r in STARTS], ids=[r[0] for r in STARTS])
def test_expected_start(worker_: WorkerView, cls: str | None, seconds: float, tier: str) -> None:
    got_s, got_tier = expected_start(worker_, URI, 4 * GB, cls)
    assert got_s == pytest.approx(seconds) and got_tier == tier


def test_place_takes_the_soonest_start_and_reports_its_load_alone() -> None:
    # A cold disk copy (2 s + build 20 s) loses to a built engine of the class reading
    # the store (4 s), which loses to nothing: the swap is taken, its load is 4 s.
    standbys = [worker("disk", disk=4 * GB), worker("swap", prebuilt="a", ready=True), worker("plain")]
    w, tier, load_s = place(standbys, URI, 4 * GB, "a")
    assert (w.id, tier, load_s) == ("swap", "swap", pytest.approx(LOAD))
    assert [s.id for s in standbys] == ["disk", "plain"]
    # Without a class the disk copy wins (2 s + 20 s < 4 s + 20 s); ties go to the first.
    w, tier, load_s = place(standbys, URI, 4 * GB)
    assert (w.id, tier, load_s) == ("disk", "disk", pytest.approx(4 * GB / DISK))
    twins = [worker("x"), worker("y")]
    assert place(twins, URI, 4 * GB)[0].id == "x"


# (failures in a row, base, cap, pause): base x 2^(failures-1), capped.
BACKOFFS = [(0, 2.0, 60.0, 2.0), (1, 2.0, 60.0, 2.0), (2, 2.0, 60.0, 4.0), (3, 2.0, 60.0, 8.0),
            (5, 2.0, 60.0, 32.0), (6, 2.0, 60.0, 60.0), (40, 2.0, 60.0, 60.0), (3, 10.0, 25.0, 25.0),
            # A thousand launches failed in one turn (a pool that wanted a thousand standbys).
            (1990, 5.0, 600.0, 600.0)]


@pytest.mark.parametrize(("failures", "base", "cap", "pause"), BACKOFFS)
def test_launch_backoff(failures: int, base: float, cap: float, pause: float) -> None:
    assert launch_backoff_s(failures, base, cap) == pause


def test_placement_among_many_standbys_weighs_every_one_that_holds_the_weights() -> None:
    # 200 standbys: the one holding the model's weights (the 150th) is found although
    # only the first PLACE_SCAN of the others are weighed; among those, the first wins.
    plain = [worker(f"w{i:03d}") for i in range(200)]
    holder = worker("w150", host=4 * GB)
    standbys = [*plain[:150], holder, *plain[151:]]
    w, tier, _ = place(list(standbys), URI, 4 * GB, special=frozenset({"w150"}))
    assert (w.id, tier) == ("w150", "host")
    w, _, _ = place(list(standbys), URI, 4 * GB, special=frozenset())
    assert w.id == "w000"
