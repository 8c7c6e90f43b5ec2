"""Lanes (simulator.lanes): a busy model's hot requests handled a window at a time give
the figures and decisions of handling them one at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.lanes import fill, in_flight_at
from simulator.sim import Simulator
from simulator.stream import chunked
from tests.simulator.support import config, costs, trace
from warm_pool.policy.decisions import Assign, Launch, Release, Stop, Terminate


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), min_size=1, max_size=40),
       st.lists(st.integers(0, 60), max_size=30))
def test_in_flight_at_counts_what_one_at_a_time_would(arrivals: list[tuple[int, int]], before: list[int]) -> None:
    # Whole numbers: arrivals, answers and the earlier requests' answers often coincide
    # (an answer at an arrival's instant comes first).
    arrivals = sorted(arrivals)
    a = np.array([float(t) for t, _ in arrivals])
    done = np.array([float(t + d) for t, d in arrivals])
    b = np.array([float(x) for x in before])
    want = [sum(1 for x in before if x > t) + sum(1 for k in range(j) if done[k] > t) for j, t in enumerate(a)]
    assert in_flight_at(a, done, b).tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=12), st.integers(1, 80))
def test_fill_is_least_loaded_first_in_rotation_order(counts: list[int], n: int) -> None:
    load = list(counts)
    want = []
    for _ in range(n):
        k = min(range(len(load)), key=lambda i: (load[i], i))
        want.append(k)
        load[k] += 1
    assert fill(np.array(counts, dtype=np.int64), n).tolist() == want


def _busy_trace(seconds: int = 240) -> list[tuple[float, str, int, int]]:
    """m0 busy (8 a second, 40 in the middle minute: its queue fills), m1 now and then."""
    rng = np.random.default_rng(7)
    rows = []
    t = 0.0
    while t < seconds:
        rate = 40.0 if 90 <= t < 150 else 8.0
        t += float(rng.exponential(1.0 / rate))
        rows.append((round(t, 6), "m0", int(rng.integers(50, 800)), int(rng.integers(20, 120))))
    rows += [(float(s), "m1", 100, 20) for s in range(5, seconds, 37)]
    return rows


def _runs(**autoscaling: object) -> tuple[object, object, Simulator]:
    cfg = config(2, standby_min=2, standby_max=3, max_instances=12, idle_grace_s=30,
                 **{"max_replicas": 8, "target_concurrency": 6, "max_concurrency_per_replica": 16,
                    "max_queue_length": 200, **autoscaling})
    c = costs(cfg, load_s=7, prefill=4000, tpot_s=0.01, release_s=2)
    # Chunks of 500 requests: a lane can start at each.
    stream = chunked(trace(_busy_trace()), 500)
    fast = Simulator(cfg, c, stream, record_decisions=True)
    exact = Simulator(cfg, c, stream, exact=True, record_decisions=True)
    return fast.run(), exact.run(), fast


def test_a_lane_gives_the_exact_runs_requests_and_decisions() -> None:
    fast, exact, sim = _runs()
    # Most of m0's requests went by its lane; it stopped when the queue filled, and
    # its replicas came and went (scale-up, then releases of replicas serving).
    assert sim.traffic.laned > 0.5 * fast.summary["per_model"]["m0"]["requests"]
    kinds = {type(d) for _, d in exact.decisions}
    assert {Launch, Assign, Release} <= kinds
    assert any(isinstance(d, Release) and d.model == "m0" for _, d in exact.decisions)
    assert fast.summary["per_model"]["m0"]["ttft_s"]["p99"] > 1.0  # its queue, in the busy minute
    # Every request is admitted at the same time, so the TTFTs, counts and cold starts
    # are the same; so is what the controller saw, so its decisions are.
    for key in ("requests", "ttft_s", "slo_met_share", "cold_starts", "cold_starts_by_tier", "activation_timeouts",
                "capacity_refusals"):
        assert fast.summary[key] == exact.summary[key], key
    for name in ("m0", "m1"):
        f, e = fast.summary["per_model"][name], exact.summary["per_model"][name]
        for key in ("requests", "ttft_s", "queue_full", "cold_starts", "slo_met_share"):
            assert f[key] == e[key], (name, key)

    def moves(r: object) -> list[object]:
        # Which replica served which request differs, so a released replica's drain
        # can end at another time: the stop or end of that instance may move.
        return [(t, d) for t, d in r.decisions if not isinstance(d, Stop | Terminate)]  # type: ignore[attr-defined]
    assert moves(fast) == moves(exact)
