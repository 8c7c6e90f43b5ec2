"""The standby sizer, stepped by hand: demand + state + now in, target + state out."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thaw.config import Ec2Pool, Pool
from warm_pool.policy.sizer import (
    CEIL_SLACK,
    SizerState,
    StandbyTarget,
    TierPlan,
    cold_start_rate,
    plan_tiers,
    size_standby,
)


def pool(**kw: Any) -> Pool:
    base: dict[str, Any] = {"shape": "gpu", "standby_min": 1, "standby_max": 5, "max_instances": 8,
                            "standby_margin": 0.0, "standby_hold_s": 60.0}
    return Pool(**{**base, **kw})


@functools.cache
def ec2_pool(stopped_min: int, stopped_max: int) -> Pool:
    ec2 = Ec2Pool(region="us-east-1", launch_template="thaw-worker", subnets=["subnet-1"],
                  instance_types=["g6.xlarge"])
    return pool(provider="ec2", ec2=ec2, stopped_standby_min=stopped_min,
                stopped_standby_max=stopped_max)


class Ticker:
    """Feeds demand to the sizer tick by tick, carrying its state, with a clock we set."""

    def __init__(self, p: Pool, boot_s: float = 60.0) -> None:
        self.pool, self.boot_s, self.state = p, boot_s, SizerState()

    def at(self, now: float, per_min: float) -> StandbyTarget:
        out, self.state = size_standby(self.state, cold_starts_per_min=per_min, boot_s=self.boot_s,
                                       pool=self.pool, now=now)
        return out


# -- the first tick: raw demand, rounding and clamping --------------------------------

@pytest.mark.parametrize(
    ("per_min", "boot_s", "margin", "lo", "hi", "raw", "target"),
    [
        # 3 cold starts/min x 120 s boot / 60 = 6, + margin 1 = 7, clamped to max 5 -> 5
        (3.0, 120.0, 1.0, 1, 5, 7.0, 5),
        # 1/min x 90 s / 60 = 1.5, + 0 -> ceil 2
        (1.0, 90.0, 0.0, 1, 5, 1.5, 2),
        # 0.5/min x 120 s / 60 = 1, + margin 0.5 = 1.5 -> 2
        (0.5, 120.0, 0.5, 1, 5, 1.5, 2),
        # 2/min x 60 s / 60 = 2 exactly -> 2 (a whole number is not rounded up)
        (2.0, 60.0, 0.0, 1, 5, 2.0, 2),
        # 2.2 x 180 / 60 + 0.4 = 7.000000000000001 in floating point -> 7, not 8
        (2.2, 180.0, 0.4, 1, 8, 2.2 * 180.0 / 60.0 + 0.4, 7),
        # no cold starts, no margin: 0 -> standby_min 1
        (0.0, 600.0, 0.0, 1, 5, 0.0, 1),
        # no cold starts, margin 2 -> 2 (a floor of 0 lets the margin decide)
        (0.0, 600.0, 2.0, 0, 4, 2.0, 2),
        # standby_max 0: never a standby, whatever the demand
        (10.0, 600.0, 0.0, 0, 0, 100.0, 0),
        # a negative rate (a metric gone wrong) is no demand: 0 + 1 -> 1
        (-5.0, 60.0, 1.0, 0, 5, 1.0, 1),
    ],
)
def test_first_tick_target(per_min: float, boot_s: float, margin: float, lo: int, hi: int,
                           raw: float, target: int) -> None:
    p = pool(standby_min=lo, standby_max=hi, standby_margin=margin)
    out, state = size_standby(SizerState(), cold_starts_per_min=per_min, boot_s=boot_s, pool=p, now=0.0)
    assert (out.raw, out.target, state.target) == (raw, target, target)
    # The band around the new target: it rises above upper, holds at or below lower.
    assert (out.upper_watermark, out.lower_watermark) == (target, target - 1)


@pytest.mark.parametrize(
    ("times", "now", "window_s", "rate"),
    [
        ([], 100.0, 60.0, 0.0),
        # 3 in (40, 100] over 60 s -> 3/min
        ([50.0, 70.0, 100.0], 100.0, 60.0, 3.0),
        # 40 is on the window's open edge, 101 is in the future: 1 in 60 s -> 1/min
        ([40.0, 70.0, 101.0], 100.0, 60.0, 1.0),
        # 5 in 300 s -> 5 x 60 / 300 = 1/min
        ([10.0, 20.0, 30.0, 40.0, 50.0], 100.0, 300.0, 1.0),
    ],
)
def test_cold_start_rate(times: list[float], now: float, window_s: float, rate: float) -> None:
    assert cold_start_rate(times, now, window_s) == rate


def test_cold_start_rate_needs_a_window() -> None:
    with pytest.raises(ValueError, match="window_s"):
        cold_start_rate([1.0], 1.0, 0.0)


# -- ticks with an injected clock ------------------------------------------------------

def test_burst_raises_the_target_at_once() -> None:
    t = Ticker(pool())
    assert t.at(0.0, 0.0).target == 1
    # 4/min x 60 s / 60 = 4 > upper watermark 1 -> 4 on this very tick
    out = t.at(1.0, 4.0)
    assert (out.target, out.reason) == (4, "rise")


def test_oscillating_demand_inside_the_band_changes_nothing() -> None:
    t = Ticker(pool())
    assert t.at(0.0, 3.0).target == 3
    for i in range(1, 200):
        # 2.1 and 3.0 both round up to 3: inside the band (2, 3], no hold ever starts
        out = t.at(float(i), 2.1 if i % 2 else 3.0)
        assert (out.target, out.reason) == (3, "steady")
    assert t.state == SizerState(3)


def test_dips_shorter_than_the_hold_change_nothing() -> None:
    t = Ticker(pool(standby_hold_s=60.0))
    assert t.at(0.0, 3.0).target == 3
    for i in range(1, 100):
        # 10 s at 1 (below the lower watermark 2), then 10 s back at 3: every dip ends
        # after 10 s < 60 s of hold
        out = t.at(10.0 * i, 1.0 if i % 2 else 3.0)
        assert out.target == 3


def test_falling_demand_waits_for_the_hold_then_falls_to_the_peak_of_the_hold() -> None:
    t = Ticker(pool(standby_hold_s=60.0))
    assert t.at(0.0, 4.0).target == 4
    # Below the lower watermark 3 from t=10: the hold runs until 10 + 60 = 70.
    assert (t.at(10.0, 2.0).target, t.state.below_since) == (4, 10.0)
    assert t.at(40.0, 1.0).reason == "hold"
    assert t.at(69.9, 1.0).target == 4
    # Held 60 s: down to 2, the most demand asked for during the hold (not the latest 1).
    out = t.at(70.0, 1.0)
    assert (out.target, out.reason) == (2, "fall")
    # A fresh hold against the new target 2: it starts at 71, falls at 131.
    assert t.at(71.0, 1.0).target == 2
    assert t.at(130.0, 1.0).target == 2
    assert t.at(131.0, 1.0).target == 1


def test_demand_back_in_the_band_during_the_hold_resets_it() -> None:
    t = Ticker(pool(standby_hold_s=60.0))
    assert t.at(0.0, 4.0).target == 4
    assert t.at(10.0, 1.0).reason == "hold"
    # Back to 4 (in the band) at 40: the hold is gone.
    assert t.at(40.0, 4.0).reason == "steady"
    assert t.state.below_since is None
    # Below again at 50: 70 (60 s after the first drop) is too early, 110 is not.
    assert t.at(50.0, 1.0).target == 4
    assert t.at(70.0, 1.0).target == 4
    assert t.at(109.0, 1.0).target == 4
    assert t.at(110.0, 1.0).target == 1


def test_a_rise_above_the_target_during_the_hold_rises_and_resets_it() -> None:
    t = Ticker(pool(standby_hold_s=60.0))
    assert t.at(0.0, 3.0).target == 3
    assert t.at(10.0, 1.0).reason == "hold"
    assert t.at(20.0, 5.0).target == 5
    assert t.state == SizerState(5)


def test_zero_hold_falls_on_the_first_tick_below() -> None:
    t = Ticker(pool(standby_hold_s=0.0))
    assert t.at(0.0, 4.0).target == 4
    assert t.at(0.0, 2.0).target == 2


def test_clamped_to_the_pool_bounds() -> None:
    t = Ticker(pool(standby_min=2, standby_max=3))
    # 100/min x 60 s / 60 = 100 -> max 3; then 0 -> after the hold, min 2
    assert t.at(0.0, 100.0).target == 3
    assert t.at(100.0, 0.0).target == 3
    assert t.at(160.0, 0.0).target == 2
    assert t.at(1000.0, 0.0).target == 2


def test_a_config_change_moves_the_target_into_the_new_bounds() -> None:
    # Target 6 from before standby_max went down to 4: 4 now, no hold needed.
    out, state = size_standby(SizerState(6, 5.0, 2), cold_starts_per_min=0.0, boot_s=60.0,
                              pool=pool(standby_max=4), now=10.0)
    # 0 demand is below 4's band: a new hold against 4 starts now.
    assert (out.target, out.reason, state) == (4, "bounds", SizerState(4, 10.0, 1))


# -- the stopped tier ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("target", "running", "stopped", "smin", "smax", "plan"),
    [
        # short 3 - 1 = 2: start the 1 stopped, launch 1
        (3, 1, 1, 0, 2, TierPlan(1, 1, 0, 0, 0, 0)),
        # short 2 from 3 stopped: start 2, 1 left = min 1
        (3, 1, 3, 1, 3, TierPlan(2, 0, 0, 0, 0, 0)),
        # short 2 from 2 stopped: start both, 0 left < min 2 -> launch 2 to stop
        (3, 1, 2, 2, 3, TierPlan(2, 0, 0, 0, 2, 0)),
        # excess 4 - 1 = 3, room 2 - 1 = 1 stopped: stop 1, terminate 2
        (1, 4, 1, 0, 2, TierPlan(0, 0, 1, 2, 0, 0)),
        # excess 1 with 1 stopped below min 1: stopping it fills the min (no launch)
        (2, 3, 0, 1, 2, TierPlan(0, 0, 1, 0, 0, 0)),
        # at target, 0 stopped < min 2: launch 2 to stop
        (2, 2, 0, 2, 3, TierPlan(0, 0, 0, 0, 2, 0)),
        # at target, 5 stopped > max 3: terminate 2 of them
        (2, 2, 5, 0, 3, TierPlan(0, 0, 0, 0, 0, 2)),
        # stopped tier already full: an excess running standby is terminated
        (1, 2, 2, 0, 2, TierPlan(0, 0, 0, 1, 0, 0)),
        # nothing wanted, nothing there
        (0, 0, 0, 0, 0, TierPlan(0, 0, 0, 0, 0, 0)),
    ],
)
def test_plan_tiers(target: int, running: int, stopped: int, smin: int, smax: int,
                    plan: TierPlan) -> None:
    assert plan_tiers(target, running, stopped, ec2_pool(smin, smax)) == plan


def test_plan_tiers_without_a_stopped_tier_launches_or_terminates() -> None:
    assert plan_tiers(3, 1, 0, pool()) == TierPlan(0, 2, 0, 0, 0, 0)
    assert plan_tiers(1, 3, 0, pool()) == TierPlan(0, 0, 0, 2, 0, 0)


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(0, 10),
       st.integers(0, 10))
def test_plan_tiers_reaches_both_targets(target: int, running: int, stopped: int, a: int,
                                         b: int) -> None:
    smin, smax = min(a, b), max(a, b)
    p = plan_tiers(target, running, stopped, ec2_pool(smin, smax))
    assert running + p.start_stopped + p.launch - p.stop_running - p.terminate_running == target
    left = stopped - p.start_stopped + p.stop_running + p.launch_to_stop - p.terminate_stopped
    assert smin <= left <= max(smax, smin)
    # Stopped instances are used up before anything fresh is launched.
    assert p.launch == 0 or p.start_stopped == stopped
    # Running ones are terminated only when the stopped tier has no room for them.
    assert p.terminate_running == 0 or stopped + p.stop_running >= smax


# -- properties over any demand --------------------------------------------------------

def wanted(p: Pool, per_min: float, boot_s: float) -> int:
    """ceil(rate x boot / 60 + margin) within the pool's bounds, recomputed independently."""
    raw = max(per_min, 0.0) * boot_s / 60.0 + p.standby_margin
    return max(p.standby_min, min(p.standby_max, math.ceil(min(raw, 1e9) - CEIL_SLACK)))


pools = st.builds(
    lambda lo, extra, margin, hold: pool(standby_min=lo, standby_max=lo + extra,
                                         max_instances=lo + extra + 1, standby_margin=margin,
                                         standby_hold_s=hold),
    st.integers(0, 4), st.integers(0, 4), st.floats(0, 3), st.sampled_from([0.0, 5.0, 30.0, 60.0]),
)
# Quarter steps of demand and whole seconds cross the watermarks and the hold's end
# often; arbitrary floats rarely land there.
ticks = st.lists(st.tuples(st.integers(0, 24).map(lambda q: q / 4), st.integers(0, 40).map(float)),
                 max_size=40)


@settings(max_examples=300, deadline=None, database=None)
@given(pools, st.sampled_from([30.0, 60.0, 90.0, 150.0]), ticks)
def test_target_stays_in_bounds_and_never_falls_before_the_hold(
    p: Pool, boot_s: float, seq: list[tuple[float, float]]
) -> None:
    # One simulation checks both properties (each tick costs hypothesis draws, not ours).
    t, now = Ticker(p, boot_s), 0.0
    target = t.at(now, 0.0).target
    run_start: float | None = None  # first tick of the current run below the target
    run_peak = 0
    for per_min, dt in seq:
        now += dt
        w = wanted(p, per_min, boot_s)
        if w < target:
            if run_start is None:
                run_start, run_peak = now, w
            run_peak = max(run_peak, w)
        else:
            run_start = None
        new = t.at(now, per_min).target
        assert p.standby_min <= new <= p.standby_max
        if new < target:
            # Only after hold_s continuously below, and never under the hold's peak.
            assert run_start is not None and now - run_start >= p.standby_hold_s
            assert new == run_peak
            run_start = None
        elif w > target:
            assert new == w  # rises at once, to the demand
        else:
            assert new == target
            # ... and it does fall once the hold has passed.
            assert run_start is None or now - run_start < p.standby_hold_s
        target = new
