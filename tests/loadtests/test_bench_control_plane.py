"""The arithmetic of `thaw bench control-plane` (loadtests/bench_control_plane.py and
plane_measures.py): sizes, quantiles from a histogram's buckets, growth exponents, route
propagation from the versions each service was first seen with, and the traffic's count. (The simulated workers it drives are tested
against the real controller in test_sim_fleet.py.)"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from loadtests.bench_control_plane import parse_size
from loadtests.plane_measures import (
    Traffic,
    Versions,
    bucket_quantile,
    exponent,
    histogram,
    loop_figures,
)

METRICS = """# HELP thaw_pool_step_seconds Time spent in one turn of the control loop
thaw_pool_step_seconds_bucket{le="0.005"} 80.0
thaw_pool_step_seconds_bucket{le="0.01"} 95.0
thaw_pool_step_seconds_bucket{le="0.1"} 99.0
thaw_pool_step_seconds_bucket{le="+Inf"} 100.0
thaw_pool_step_seconds_count 100.0
thaw_pool_policy_seconds_bucket{le="0.005"} 3.0
"""


def test_sizes_are_models_by_workers() -> None:
    assert parse_size("10000x1000") == (10000, 1000) and parse_size("5X2") == (5, 2)
    for bad in ("1000", "0x3", "axb"):
        with pytest.raises(SystemExit):
            parse_size(bad)


def test_a_quantile_is_the_bucket_that_holds_it_between_two_reads() -> None:
    after = histogram(METRICS, "thaw_pool_step_seconds")
    assert after == {0.005: 80.0, 0.01: 95.0, 0.1: 99.0, math.inf: 100.0}
    assert bucket_quantile({}, after, 0.5) == 0.005 and bucket_quantile({}, after, 0.99) == 0.1
    # Only what was counted since the first read: 10 turns, 2 within 5 ms, 7 within 10 ms.
    before = {0.005: 78.0, 0.01: 88.0, 0.1: 89.0, math.inf: 90.0}
    assert [bucket_quantile(before, after, q) for q in (0.2, 0.5, 0.7, 0.9)] == [0.005, 0.01, 0.01, 0.1]
    assert bucket_quantile(after, after, 0.5) is None


def test_the_loops_figures_are_what_was_counted_between_two_scrapes() -> None:
    before = ('thaw_pool_step_seconds_bucket{le="0.01"} 5.0\nthaw_pool_step_seconds_bucket{le="+Inf"} 5.0\n'
              "thaw_pool_step_seconds_count 5.0\nthaw_pool_step_seconds_sum 0.02\n"
              "thaw_pool_db_statements_total 10.0\n")
    after = ('thaw_pool_step_seconds_bucket{le="0.01"} 9.0\nthaw_pool_step_seconds_bucket{le="+Inf"} 15.0\n'
             "thaw_pool_step_seconds_count 15.0\nthaw_pool_step_seconds_sum 1.02\n"
             'thaw_pool_models_judged_bucket{le="10.0"} 3.0\nthaw_pool_models_judged_bucket{le="+Inf"} 3.0\n'
             "thaw_pool_models_judged_count 3.0\nthaw_pool_models_judged_sum 12.0\n"
             "thaw_pool_db_statements_total 40.0\n")
    got = loop_figures(before, after)
    assert got["turns"] == 10 and got["step_mean_s"] == 0.1 and got["step_p50_s"] == math.inf
    assert got["step_p99_s"] == math.inf and got["db_statements_per_turn"] == 3.0
    assert (got["judged_mean"], got["judged_p50"]) == (4.0, 10.0)
    assert got["policy_mean_s"] is None  # nothing counted


def test_growth_exponents() -> None:
    assert exponent(1.0, 10.0, 1000, 10000) == 1.0
    assert exponent(1.0, 100.0, 1000, 10000) == 2.0
    assert exponent(None, 1.0, 1, 10) is None and exponent(1.0, 2.0, 5, 5) is None


def test_route_propagation_waits_for_the_last_activator_to_hold_each_version() -> None:
    plane = SimpleNamespace(controller_url="c", activator_urls=["a0", "a1"])
    rv = Versions(plane)  # type: ignore[arg-type]
    rv.first = {"controller": {1: 10.0, 2: 20.0, 3: 30.0},
                # a1 skipped version 2: it holds it once it has 3.
                "activator-0": {1: 10.1, 2: 20.2, 3: 30.05},
                "activator-1": {1: 10.3, 3: 30.5}}
    got = rv.report()
    assert got["versions"] == 3 and got["p50_s"] == pytest.approx(0.5) and got["p99_s"] == pytest.approx(10.5)


def test_traffic_counts_an_answer_only_with_a_streamed_token() -> None:
    plane = SimpleNamespace(activator_urls=["a0"], ready_models=lambda: {"m1": "u"})
    t = Traffic(plane, 0)  # type: ignore[arg-type]
    t.models = ["m1"]
    t.rows = [(200, 0.01, None), (200, 0.03, None), (200, None, None), (503, None, None), (None, None, "reset")]
    got = t.report()
    assert (got["sent"], got["answered"]) == (5, 2) and got["ttft_p50_s"] == 0.01 and got["ttft_p99_s"] == 0.03
    assert got["failed"] == ["200", "503", "None reset"]
