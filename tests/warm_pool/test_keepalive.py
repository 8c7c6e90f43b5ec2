"""The hybrid histogram keep-alive policy: idle intervals in, windows and decisions out.

Unless a case says otherwise: bins of 60 s up to 4 h (240 bins), head p5, tail p99,
margin 0.1, min_samples 10, out-of-range share at most 0.5, min_cv 2.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thaw.config import Autoscaling, KeepAliveHistogram
from warm_pool.keepalive import (
    IdleHistogram,
    KeepAliveDecision,
    KeepAliveWindow,
    idle_interval,
    keep_alive_decision,
    keep_alive_window,
    record_idle,
)

CFG = KeepAliveHistogram()


def autoscaling(keep_alive: str = "histogram", idle_grace_s: float = 300.0, **hist: Any) -> Autoscaling:
    return Autoscaling(keep_alive=keep_alive, idle_grace_s=idle_grace_s,  # type: ignore[arg-type]
                       keep_alive_histogram=KeepAliveHistogram(**hist))


def histogram(samples: Iterable[float], cfg: KeepAliveHistogram = CFG) -> IdleHistogram:
    h = IdleHistogram()
    for s in samples:
        h = record_idle(h, s, cfg)
    return h


# --- recording -------------------------------------------------------------------


@pytest.mark.parametrize(("idle_s", "counts", "out_of_range"), [
    (0.0, (1,), 0),                  # zero-length idle: bin 0 (0-60 s)
    (59.999, (1,), 0),               # just under the first edge: still bin 0
    (60.0, (0, 1), 0),               # on an edge: the bin it opens (lower edge inclusive)
    (630.0, (0,) * 10 + (1,), 0),    # 630 // 60 = 10 (600-660 s)
    (14399.9, (0,) * 239 + (1,), 0),  # the last bin, 239 (14340-14400 s)
    (14400.0, (), 1),                # exactly range_s: out of range
    (1e9, (), 1),
    (float("inf"), (), 1),
], ids=lambda v: repr(v) if isinstance(v, float) else None)
def test_record_idle_bins(idle_s: float, counts: tuple[int, ...], out_of_range: int) -> None:
    h = record_idle(IdleHistogram(), idle_s, CFG)
    assert (h.counts, h.out_of_range, h.total()) == (counts, out_of_range, 1)


def test_record_idle_adds_to_existing_bins_without_mutating() -> None:
    before = histogram([30.0, 630.0])
    after = record_idle(before, 45.0, CFG)
    assert after.counts == (2,) + (0,) * 9 + (1,)
    assert before.counts == (1,) + (0,) * 9 + (1,)


@pytest.mark.parametrize("idle_s", [-0.001, -60.0, float("nan")])
def test_record_idle_rejects_negative_and_nan(idle_s: float) -> None:
    with pytest.raises(ValueError, match="idle interval"):
        record_idle(IdleHistogram(), idle_s, CFG)


@pytest.mark.parametrize(("idle_since", "arrival", "expected"), [
    (None, 100.0, None),      # never went idle (first request, or a request was in flight)
    (100.0, 700.0, 600.0),
    (100.0, 100.0, 0.0),      # arrived the instant it went idle
    (100.0, 99.5, 0.0),       # stamped before the idle start: clock skew, not negative
])
def test_idle_interval(idle_since: float | None, arrival: float, expected: float | None) -> None:
    assert idle_interval(idle_since, arrival) == expected


# --- windows ---------------------------------------------------------------------


@dataclass(frozen=True)
class WindowCase:
    id: str
    samples: list[float]
    prewarm_after_s: float | None
    keep_until_s: float
    hist: dict[str, Any]


WINDOW_CASES = [
    # 20 samples in bin 10 (600-660 s): head = 600 * 0.9 = 540; tail = 660 * 1.1 = 726.
    WindowCase("one-bin", [630.0] * 20, 540.0, 726.0, {}),
    # All on the edge 600 s: bin 10 again (lower edge inclusive): 540; 726.
    WindowCase("on-edge", [600.0] * 20, 540.0, 726.0, {}),
    # Just under it: bin 9 (540-600 s): head = 540 * 0.9 = 486; tail = 600 * 1.1 = 660.
    WindowCase("under-edge", [599.999] * 20, 486.0, 660.0, {}),
    # Bin 0 (0-60 s): head = 0 -> no pre-warm, keep from idle start; tail = 60 * 1.1 = 66.
    WindowCase("first-bin", [30.0] * 20, None, 66.0, {}),
    # Zero-length idle intervals land in bin 0 as well.
    WindowCase("zero-length", [0.0] * 20, None, 66.0, {}),
    # 100 samples; p5 rank = 5, p99 rank = 99. 5 in bin 2 (120-180 s): cumulative 5 >= 5,
    # head = 120 * 0.9 = 108. 94 in bin 10: cumulative 99 >= 99, tail = 660 * 1.1 = 726;
    # the one at 900 s is past the 99th percentile.
    WindowCase("head-p5", [150.0] * 5 + [630.0] * 94 + [900.0], 108.0, 726.0, {}),
    # Only 4 in bin 2: cumulative 4 < 5, so the head moves to bin 10: 540; tail 726.
    WindowCase("head-past-outliers", [150.0] * 4 + [630.0] * 95 + [900.0], 540.0, 726.0, {}),
    # 20 samples, p99 rank = ceil(19.8) = 20: the one in the last bin, 239 (14340-14400 s).
    # head = 600 * 0.9 = 540; tail = 14400 * 1.1 = 15840.
    WindowCase("tail-in-last-bin", [630.0] * 19 + [14399.0], 540.0, 15840.0, {}),
    # Margin 0: the bin edges themselves: 600; 660.
    WindowCase("margin-0", [630.0] * 20, 600.0, 660.0, {"margin": 0.0}),
    # Margin 1: head = 600 * 0 = 0 -> no pre-warm; tail = 660 * 2 = 1320.
    WindowCase("margin-1", [630.0] * 20, None, 1320.0, {"margin": 1.0}),
    # Bins of 300 s up to 1000 s: [0,300) [300,600) [600,900) [900,1000), the last cut at
    # range_s. All in it: head = 900 * 0.9 = 810; tail = min(1200, 1000) * 1.1 = 1100.
    # (cv over 4 bins with one full = sqrt(3) = 1.73, hence min_cv 1.)
    WindowCase("partial-last-bin", [950.0] * 20, 810.0, 1100.0,
               {"bin_s": 300.0, "range_s": 1000.0, "min_cv": 1.0}),
    # Head p0 is the first non-empty bin, not bin 0: bin 5 (300-360 s) -> 270; tail p100 is
    # the last non-empty bin, 12 (720-780 s) -> 858.
    WindowCase("p0-p100", [330.0, 630.0] * 10 + [750.0], 270.0, 858.0,
               {"head_percentile": 0.0, "tail_percentile": 100.0}),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.id)
def test_histogram_window(case: WindowCase) -> None:
    a = autoscaling(**case.hist)
    window = keep_alive_window(histogram(case.samples, a.keep_alive_histogram), a)
    assert window.mode == "histogram", window.reason
    assert window.reason == "histogram"
    assert window.prewarm_after_s == pytest.approx(case.prewarm_after_s)
    assert window.keep_until_s == pytest.approx(case.keep_until_s)


@pytest.mark.parametrize(("samples", "reason"), [
    # 9 in range < min_samples 10.
    ([630.0] * 9, "too few samples (9 < 10)"),
    # 10 intervals, 4 out of range: share 0.4 <= 0.5, but only 6 in range.
    ([630.0] * 6 + [20000.0] * 4, "too few samples (6 < 10)"),
    # 3 intervals: too few to judge the out-of-range share (2 / 3) yet.
    ([630.0] + [20000.0] * 2, "too few samples (1 < 10)"),
    # 10 intervals, 6 out of range: share 6 / 10 = 0.6 > 0.5.
    ([630.0] * 4 + [20000.0] * 6, "out-of-range share 0.6 > 0.5"),
    # One per bin in all 240 bins: every count 1, std 0, cv 0.
    ([60.0 * i + 30 for i in range(240)], "flat pattern (cv 0 < 2)"),
    # 48 bins with one each out of 240: cv = sqrt(240 / 48 - 1) = sqrt(4) = 2 -> regular;
    # with 49: sqrt(240 / 49 - 1) = 1.97 < 2.
    ([60.0 * i + 30 for i in range(49)], "flat pattern (cv 1.97 < 2)"),
])
def test_fallback_to_fixed(samples: list[float], reason: str) -> None:
    window = keep_alive_window(histogram(samples), autoscaling(idle_grace_s=300.0))
    assert window == KeepAliveWindow("fixed", reason, None, 300.0)


def test_cv_at_exactly_min_cv_is_regular() -> None:
    # 48 of 240 bins with one each: cv = sqrt(240 / 48 - 1) = 2, not below min_cv 2.
    window = keep_alive_window(histogram([60.0 * i + 30 for i in range(48)]), autoscaling())
    assert window.mode == "histogram"


def test_bins_past_a_shrunk_range_count_as_out_of_range() -> None:
    # Recorded with the 4 h range; read with a 1000 s range (17 bins): the 6 at 2000 s
    # (bin 33) are out of range now: share 6 / 10 = 0.6 > 0.5.
    h = histogram([630.0] * 4 + [2000.0] * 6)
    window = keep_alive_window(h, autoscaling(range_s=1000.0))
    assert window.reason == "out-of-range share 0.6 > 0.5"


def test_fixed_config_ignores_a_representative_histogram() -> None:
    h = histogram([630.0] * 100)  # would give pre-warm 540, keep-alive 726
    window = keep_alive_window(h, autoscaling(keep_alive="fixed", idle_grace_s=120.0))
    assert window == KeepAliveWindow("fixed", "fixed keep-alive (config)", None, 120.0)
    assert keep_alive_window(IdleHistogram(), autoscaling(keep_alive="fixed")).keep_until_s == 300.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=20000, allow_nan=False), max_size=60),
       st.floats(min_value=0, max_value=1))
def test_window_invariants(samples: list[float], margin: float) -> None:
    a = autoscaling(margin=margin, min_samples=1, min_cv=0.0, max_out_of_range_share=1.0)
    h = histogram(samples, a.keep_alive_histogram)
    assert h.total() == len(samples)
    assert IdleHistogram.from_json(json.loads(json.dumps(h.to_json()))) == h
    window = keep_alive_window(h, a)
    in_range = [s for s in samples if s < 14400]
    if not in_range:
        assert window.mode == "fixed"
        return
    assert window.mode == "histogram"
    # The tail covers at least 99 % of the in-range samples, and never more than the range.
    covered = sum(s < window.keep_until_s for s in in_range)
    assert covered >= 0.99 * len(in_range)
    assert window.keep_until_s <= 14400 * (1 + margin) + 1e-6
    if window.prewarm_after_s is not None:
        # Pre-warming never starts after 95 % of the samples have arrived.
        assert 0 < window.prewarm_after_s < window.keep_until_s
        assert sum(s < window.prewarm_after_s for s in in_range) <= 0.05 * len(in_range)


# --- decisions -------------------------------------------------------------------

PREWARM = KeepAliveWindow("histogram", "histogram", 540.0, 726.0)
NO_PREWARM = KeepAliveWindow("histogram", "histogram", None, 66.0)
FIXED = KeepAliveWindow("fixed", "too few samples (0 < 10)", None, 300.0)


@pytest.mark.parametrize(("window", "now", "keep", "prewarm"), [
    # Idle since t0 = 1000, pre-warm at 1000 + 540 = 1540, keep until 1000 + 726 = 1726.
    (PREWARM, 1000.0, False, False),   # released at once
    (PREWARM, 1539.9, False, False),   # still at zero
    (PREWARM, 1540.0, True, True),     # brought back
    (PREWARM, 1725.9, True, True),
    (PREWARM, 1726.0, False, False),   # dropped: past keep_until
    (PREWARM, 9999.0, False, False),
    (PREWARM, 990.0, False, False),    # now before t0 (skew): as at t0
    # No pre-warm: kept from t0 until 1000 + 66 = 1066.
    (NO_PREWARM, 1000.0, True, False),
    (NO_PREWARM, 1065.9, True, False),
    (NO_PREWARM, 1066.0, False, False),
    (NO_PREWARM, 990.0, True, False),
    # Fixed: kept until 1000 + 300 = 1300.
    (FIXED, 1299.0, True, False),
    (FIXED, 1300.0, False, False),
    # idle_grace_s 0: released at once.
    (KeepAliveWindow("fixed", "fixed keep-alive (config)", None, 0.0), 1000.0, False, False),
])
def test_keep_alive_decision_tick_by_tick(window: KeepAliveWindow, now: float, keep: bool,
                                          prewarm: bool) -> None:
    d = keep_alive_decision(window, idle_since=1000.0, now=now)
    assert (d.keep, d.prewarm) == (keep, prewarm), d.reason
    assert isinstance(d, KeepAliveDecision) and d.reason


# --- traces ----------------------------------------------------------------------

SERVICE_S = 5.0  # each request keeps the model busy this long, then it goes idle
TICK_S = 5.0


@dataclass
class Replay:
    windows: list[KeepAliveWindow] = field(default_factory=list)  # one per gap
    arrivals: int = 0  # counted ones, after the warm-up
    warm: int = 0
    replica_s: float = 0.0  # replica-seconds held while idle


def replay(arrivals: list[float], a: Autoscaling, warmup: int) -> Replay:
    """Step the policy through a trace. At each idle start t0 the window comes from the
    histogram so far; the controller asks keep_alive_decision every TICK_S; an arrival
    finds a replica if one is kept at that instant. The first ``warmup`` gaps are not
    counted."""
    h, out = IdleHistogram(), Replay()
    for prev, arrival in zip(arrivals, arrivals[1:], strict=False):
        t0 = prev + SERVICE_S
        window = keep_alive_window(h, a)
        kept_s, now = 0.0, t0
        while now < arrival:
            d = keep_alive_decision(window, t0, now)
            if d.keep:
                # Never held past t0 + keep_until; with pre-warm, only because of it.
                assert now - t0 < window.keep_until_s
                assert d.prewarm == (window.prewarm_after_s is not None)
                kept_s += min(TICK_S, arrival - now)
            now += TICK_S
        # The time held per gap is bounded by the window.
        assert kept_s <= window.keep_until_s - (window.prewarm_after_s or 0.0) + TICK_S
        if len(out.windows) >= warmup:
            out.arrivals += 1
            out.warm += keep_alive_decision(window, t0, arrival).keep
            out.replica_s += kept_s
        out.windows.append(window)
        interval = idle_interval(t0, arrival)
        assert interval is not None
        h = record_idle(h, interval, a.keep_alive_histogram)
    return out


def regular_trace(n: int = 300, seed: int = 7) -> list[float]:
    # A request every 10 min +/- 20 s: idle intervals 600 - 5 +/- 20 = 575..615 s, in
    # bins 9 (540-600) and 10 (600-660): head = 540 * 0.9 = 486; tail = 660 * 1.1 = 726.
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += 600.0 + rng.uniform(-20.0, 20.0)
        out.append(t)
    return out


def test_regular_trace_is_prewarmed_and_cheaper_than_a_fixed_ten_minutes() -> None:
    trace = regular_trace()
    # The fallback while warming up is the same fixed 10 minutes, so only the policy differs.
    hist_a = autoscaling(idle_grace_s=600.0)
    warmup = hist_a.keep_alive_histogram.min_samples
    hist = replay(trace, hist_a, warmup)
    fixed = replay(trace, autoscaling(keep_alive="fixed", idle_grace_s=600.0), warmup)

    # Fixed for the first min_samples gaps, then the histogram's 486 s / 726 s throughout.
    assert {w.mode for w in hist.windows[:warmup]} == {"fixed"}
    assert all(w.mode == "histogram" and w.prewarm_after_s == pytest.approx(486.0)
               and w.keep_until_s == pytest.approx(726.0) for w in hist.windows[warmup:])
    warm_share = hist.warm / hist.arrivals
    fixed_share = fixed.warm / fixed.arrivals
    per_gap = hist.replica_s / hist.arrivals
    fixed_per_gap = fixed.replica_s / fixed.arrivals
    print(f"\nregular trace, {hist.arrivals} arrivals after warm-up: histogram warm {warm_share:.1%}, "
          f"{hist.replica_s:.0f} replica-s ({per_gap:.0f}/gap); fixed 600 s warm {fixed_share:.1%}, "
          f"{fixed.replica_s:.0f} replica-s ({fixed_per_gap:.0f}/gap)")
    assert warm_share >= 0.9
    # Held from 486 s to the arrival (575..615 s): about 109 s a gap, against about
    # min(idle, 600) = 593 s for the fixed 10 minutes.
    assert hist.replica_s < 0.3 * fixed.replica_s
    assert per_gap <= 615 - 486 + TICK_S


def irregular_trace(mean_gap_s: float, n: int = 300, seed: int = 11) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0 / mean_gap_s)
        out.append(t)
    return out


@pytest.mark.parametrize(("mean_gap_s", "reason"), [
    # Exponential gaps, mean 1 h: spread over the 4 h of bins (about 2 % past it), counts
    # falling from ~5 to ~0 a bin: cv around 1, below 2.
    (3600.0, "flat pattern"),
    # Mean 8 h: P(gap > 4 h) = e^-0.5 = 0.61, over the 0.5 allowed.
    (8 * 3600.0, "out-of-range share"),
])
def test_irregular_trace_falls_back_to_fixed(mean_gap_s: float, reason: str) -> None:
    a = autoscaling(idle_grace_s=300.0)
    trace = irregular_trace(mean_gap_s)
    h = IdleHistogram()
    for prev, arrival in zip(trace, trace[1:], strict=False):
        h = record_idle(h, max(0.0, arrival - prev - SERVICE_S), a.keep_alive_histogram)
    window = keep_alive_window(h, a)
    assert (window.mode, window.prewarm_after_s, window.keep_until_s) == ("fixed", None, 300.0)
    assert window.reason.startswith(reason), window.reason


# --- persistence -----------------------------------------------------------------


def test_json_round_trip() -> None:
    h = histogram([0.0, 630.0, 630.0, 14399.0, 20000.0])
    data = json.loads(json.dumps(h.to_json()))
    assert data == {"counts": [1] + [0] * 9 + [2] + [0] * 228 + [1], "out_of_range": 1}
    assert IdleHistogram.from_json(data, CFG) == h
    assert IdleHistogram.from_json(IdleHistogram().to_json()) == IdleHistogram()


@pytest.mark.parametrize("data", [
    None,
    [1, 2],
    "counts",
    {},
    {"counts": [1]},                                        # missing out_of_range
    {"counts": [1], "out_of_range": 0, "extra": 1},
    {"counts": "1,2", "out_of_range": 0},
    {"counts": {"0": 1}, "out_of_range": 0},
    {"counts": [1, -1], "out_of_range": 0},
    {"counts": [1, 2.5], "out_of_range": 0},
    {"counts": [1, "2"], "out_of_range": 0},
    {"counts": [True], "out_of_range": 0},
    {"counts": [None], "out_of_range": 0},
    {"counts": [1], "out_of_range": -1},
    {"counts": [1], "out_of_range": 1.0},
    {"counts": [1], "out_of_range": False},
    {"counts": [1], "out_of_range": None},
    {"counts": [0] * 241, "out_of_range": 0},               # 241 bins > 14400 / 60 = 240
], ids=repr)
def test_from_json_rejects_garbage(data: Any) -> None:
    with pytest.raises(ValueError):
        IdleHistogram.from_json(data, CFG)


def test_from_json_bin_limit_needs_the_config() -> None:
    data = {"counts": [0] * 241, "out_of_range": 0}
    assert len(IdleHistogram.from_json(data).counts) == 241
    assert len(IdleHistogram.from_json({"counts": [0] * 240, "out_of_range": 0}, CFG).counts) == 240


def test_constructor_validates_too() -> None:
    with pytest.raises(ValueError):
        IdleHistogram((1, -2))
    with pytest.raises(ValueError):
        IdleHistogram([1, 2])  # type: ignore[arg-type]
