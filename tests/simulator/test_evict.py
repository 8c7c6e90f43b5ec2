"""A full pool in the simulator: an idle replica yields to a model waiting at zero
(policy.evict), a busy one never does, and a model nothing can be made room for is
refused at once; the fast mode judges as the controller does throughout."""

from __future__ import annotations

import random
from typing import Any

import pytest

from simulator.sim import Simulator
from tests.simulator.support import config, costs, equivalence_cfg, trace
from thaw.config import ThawConfig
from warm_pool.policy.decisions import Assign, Release


def full_pool(**autoscaling: Any) -> ThawConfig:
    # One instance in all, standing by at the start; keep-alive 600 s.
    return config(2, idle_grace_s=600, standby_min=1, standby_max=1, max_instances=1, **autoscaling)


def run(cfg: ThawConfig, rows: list[tuple[float, str, int, int]], *, exact: bool = False) -> Any:
    return Simulator(cfg, costs(cfg), trace(rows), record_decisions=True, exact=exact).run()


def test_a_cold_start_takes_the_idle_instance_of_another_model() -> None:
    # m0 at 0 takes the one standby: ready at 10, answered by 11.1 (TTFT 10.1, then 100
    # tokens x 0.01 s), idle from then, kept 600 s. m1 at 50: no standby, no room under
    # max_instances 1, m0 idle 38.9 s: its replica is evicted at 50 (release 0 s: standby
    # at once), and m1 takes it on the tick its standing by wakes, at 50 too: ready at
    # 60, TTFT 10.1 s.
    cfg = full_pool()
    r = run(cfg, [(0.0, "m0", 100, 100), (50.0, "m1", 100, 100)])
    [(at, ev)] = [(t, d) for t, d in r.decisions if isinstance(d, Release)]
    assert (at, ev.model, ev.reason, ev.for_model, ev.idle_s) == (50.0, "m0", "evicted", "m1", pytest.approx(38.9))
    assert [(t, d.model) for t, d in r.decisions if isinstance(d, Assign)] == [(0.0, "m0"), (50.0, "m1")]
    s = r.summary
    assert (s["evictions"], s["capacity_refusals"], s["activation_timeouts"]) == (1, 0, 0)
    assert s["per_model"]["m0"]["evictions"] == 1
    assert s["per_model"]["m1"]["ttft_s"]["p50"] == pytest.approx(10.1)
    assert run(cfg, [(0.0, "m0", 100, 100), (50.0, "m1", 100, 100)], exact=True).decisions == r.decisions


def test_a_replica_with_a_request_in_flight_is_never_evicted() -> None:
    # m0's request at 0 decodes 10,000 tokens (100 s): in flight from 10 to 110.1. m1 at
    # 50 finds the pool full and nothing idle: refused (503) at 53, past its grace of 3 s,
    # not after its activation timeout; m0's request completes. m1 again at 200 (m0 idle since 110.1):
    # m0's replica is evicted for it.
    cfg = full_pool()
    rows = [(0.0, "m0", 100, 10_000), (50.0, "m1", 100, 100), (200.0, "m1", 100, 100)]
    r = run(cfg, rows)
    s = r.summary
    assert s["per_model"]["m1"]["capacity_refusals"] == 1 and s["activation_timeouts"] == 0
    assert s["per_model"]["m0"]["ttft_s"]["p50"] == pytest.approx(10.1) and s["per_model"]["m0"]["slo_met_share"] == 0
    assert [(t, d.model, d.reason) for t, d in r.decisions if isinstance(d, Release)] == [(200.0, "m0", "evicted")]
    assert s["evictions"] == 1 and s["per_model"]["m1"]["requests"] == 2
    assert run(cfg, rows, exact=True).decisions == r.decisions


def test_a_min_replicas_floor_is_never_evicted() -> None:
    # m0 keeps one replica whatever its traffic: m1 is refused, m0's replica stays.
    data = full_pool().model_dump()
    data["models"][0]["autoscaling"]["min_replicas"] = 1
    cfg = ThawConfig.model_validate(data)
    r = run(cfg, [(0.0, "m0", 100, 100), (50.0, "m1", 100, 100)])
    assert not [d for _, d in r.decisions if isinstance(d, Release)]
    assert r.summary["per_model"]["m1"]["capacity_refusals"] == 1 and r.summary["evictions"] == 0


def test_the_fast_mode_judges_a_full_pool_as_the_controller_does() -> None:
    """Seeded traces over four models in a pool of two instances: evictions and
    refusals every few seconds, the same in both modes."""
    cfg = equivalence_cfg(12)
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    for seed in range(3):
        rnd = random.Random(seed)
        rows = [(round(rnd.uniform(0, 600), 3), f"m{rnd.randint(0, 3)}", rnd.randint(1, 4000), rnd.randint(1, 400))
                for _ in range(120)]
        fast = Simulator(cfg, c, trace(rows), record_decisions=True).run()
        exact = Simulator(cfg, c, trace(rows), exact=True, record_decisions=True).run()
        assert fast.decisions == exact.decisions
        assert fast.summary == exact.summary
        assert fast.summary["evictions"] and fast.summary["capacity_refusals"]
