"""The learned keep-alive policy: idle intervals in, windows and decisions out.

Unless a case says otherwise: bins of 60 s up to 4 h (240 bins), a cold start priced at
idle_grace_s (300 s), pre-warm 60 s ahead, prior_samples 10, prior_floor 1, and trust 0:
the histogram's own choices (the bounds trust puts on them are tested on their own).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thaw.config import Autoscaling, KeepAliveHistogram, parse_config
from warm_pool.policy.keepalive import (
    IdleHistogram,
    IdlePools,
    KeepAliveDecision,
    KeepAliveWindow,
    PooledCounts,
    Tier,
    _bin_count,
    _in_range,
    _smoothed,
    cold_start_price_s,
    idle_interval,
    keep_alive_decision,
    keep_alive_window,
    pool_key,
    pooled,
    price_tier,
    record_idle,
    slot_of,
)

CFG = KeepAliveHistogram()


def autoscaling(keep_alive: str = "histogram", idle_grace_s: float = 300.0, **hist: Any) -> Autoscaling:
    return Autoscaling(keep_alive=keep_alive, idle_grace_s=idle_grace_s,  # type: ignore[arg-type]
                       keep_alive_histogram=KeepAliveHistogram(**{"trust": 0.0, "smoothing": 0.0, **hist}))


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
], ids=lambda v: repr(v) if isinstance(v, float) else None)
def test_record_idle_bins(idle_s: float, counts: tuple[int, ...], out_of_range: int) -> None:
    h = record_idle(IdleHistogram(), idle_s, CFG)
    assert (h.counts, h.out_of_range, h.total()) == (counts, out_of_range, 1)
    # An out-of-range interval's length is kept: holding across it would cost that.
    assert h.out_of_range_s == (idle_s if out_of_range else 0.0)


def test_record_idle_adds_to_existing_bins_without_mutating() -> None:
    before = histogram([30.0, 630.0])
    after = record_idle(before, 45.0, CFG)
    assert after.counts == (2,) + (0,) * 9 + (1,)
    assert before.counts == (1,) + (0,) * 9 + (1,)


@pytest.mark.parametrize("idle_s", [-0.001, -60.0, float("nan"), float("inf")])
def test_record_idle_rejects_negative_nan_and_infinite(idle_s: float) -> None:
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
    tier: Tier = "launch"


INF = math.inf

WINDOW_CASES = [
    # 20 gaps of 630 s (bin 10, 600-660 s), a cold start worth 600 s: holding across each
    # costs ~630 s, a cold start 600 s, holding from a replica asked for 60 s before the
    # bin's edge (540 s) to the arrival ~90 s: pre-warm at 540, keep until 660.
    WindowCase("regular", [630.0] * 20, 540.0, 660.0, {"cold_start_price_s": 600}),
    # The same gaps, no pre-warm allowed: a cold start (600) is cheaper than 630 s held.
    WindowCase("regular-no-prewarm", [630.0] * 20, None, 0.0, {"cold_start_price_s": 600, "prewarm": False}),
    # Priced at 700 s instead, holding across wins.
    WindowCase("regular-dear", [630.0] * 20, None, 660.0, {"cold_start_price_s": 700, "prewarm": False}),
    # An adapter load is priced 600 x 0.05 = 30 s, under the ~90 s a pre-warm holds.
    WindowCase("adapter", [630.0] * 20, None, 0.0, {"cold_start_price_s": 600}, "adapter"),
    # A swap: 600 x 0.25 = 150 s, over 90 s: pre-warmed as a launch would be.
    WindowCase("swap", [630.0] * 20, 540.0, 660.0, {"cold_start_price_s": 600}, "swap"),
    # Short gaps (bin 0): keep until the first edge; a pre-warm there would start at 0.
    WindowCase("short", [30.0] * 20, None, 60.0, {"cold_start_price_s": 300}),
    # Ski rental, priced 300 s: half the gaps 30 s, half 1000 s. Keeping until 60 s costs
    # 10 x 30 + 10 x (60 + 300) = 3900; until 1020 s, 10 x 30 + 10 x 1000 = 10300;
    # letting go at once 20 x 300 = 6000. Keep until 60 s.
    WindowCase("ski-rental", [30.0] * 10 + [1000.0] * 10, None, 60.0, {"cold_start_price_s": 300, "prewarm": False}),
    # Every gap past the range (20000 s), priced 30000 s: held across, until the next
    # request (20000 < 30000); with a cold start worth 10000 s, let go at once.
    WindowCase("forever", [20000.0] * 5, None, INF, {"cold_start_price_s": 30000, "prewarm": False}),
    WindowCase("past-range-cheap", [20000.0] * 5, None, 0.0, {"cold_start_price_s": 10000, "prewarm": False}),
    # Bins of 300 s up to 1000 s: [0,300) [300,600) [600,900) [900,1000), the last cut at
    # range_s (its midpoint 950). Gaps of 950 s priced 2000: keep until 1000.
    WindowCase("partial-last-bin", [950.0] * 20, None, 1000.0,
               {"bin_s": 300.0, "range_s": 1000.0, "cold_start_price_s": 2000, "prewarm": False}),
    # The price defaults to idle_grace_s (300 s here): 630 s gaps are let go at once
    # without pre-warm.
    WindowCase("price-is-idle-grace", [630.0] * 20, None, 0.0, {"prewarm": False}),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.id)
def test_histogram_window(case: WindowCase) -> None:
    a = autoscaling(**case.hist)
    window = keep_alive_window(histogram(case.samples, a.keep_alive_histogram), a, None, case.tier)
    assert window.mode == "histogram", window.reason
    assert window.prewarm_after_s == pytest.approx(case.prewarm_after_s)
    assert window.keep_until_s == pytest.approx(case.keep_until_s)


def test_with_nothing_to_learn_from_it_is_the_fixed_timeout() -> None:
    a = autoscaling(idle_grace_s=300.0)
    assert keep_alive_window(IdleHistogram(), a) == KeepAliveWindow(
        "fixed", "no idle interval yet, its own or pooled", None, 300.0)
    assert keep_alive_window(IdleHistogram(), a, IdleHistogram()).mode == "fixed"


def test_a_model_with_no_history_reads_the_pooled_prior_and_its_own_replaces_it() -> None:
    a = autoscaling(cold_start_price_s=300.0)
    # The fleet's gaps: 630 s. A model with none of its own is pre-warmed on them.
    prior = histogram([630.0] * 30)
    first = keep_alive_window(IdleHistogram(), a, prior)
    assert (first.prewarm_after_s, first.keep_until_s) == (540.0, 660.0)
    assert "0 own intervals, pooled prior x10" in first.reason
    # Its own gaps are 30 s: past prior_samples (10) the prior weighs prior_floor (1)
    # interval, and its own decide: kept until 60 s, no pre-warm.
    own = histogram([30.0] * 20)
    later = keep_alive_window(own, a, prior)
    assert (later.prewarm_after_s, later.keep_until_s) == (None, 60.0)
    assert "20 own intervals, pooled prior x1" in later.reason
    # Three of its own weigh 3 against the prior's 7: still mostly the fleet's.
    assert keep_alive_window(histogram([30.0] * 3), a, prior).keep_until_s == 660.0
    # With no floor, past prior_samples the prior is gone altogether.
    no_floor = autoscaling(cold_start_price_s=300.0, prior_floor=0.0)
    assert keep_alive_window(own, no_floor, prior) == keep_alive_window(own, no_floor, None)


def test_smoothing_reads_a_sparse_models_scattered_gaps_as_a_spread_not_a_cluster_to_pre_warm_on() -> None:
    # Six gaps of a sparse model, from 11 min to 1.8 h (one from Azure's conversations
    # spread over 100 models), priced at 550 s. Counted as they are, the two gaps of
    # ~24 min are a spike: the window lets go and pre-warms at 1,320 s for 180 s, a bet
    # the next gap lands there. Smoothed, they say "tens of minutes to hours": let go,
    # with no pre-warm before the range's end.
    gaps = [1494.0, 1428.0, 4410.0, 820.0, 6655.0, 653.0]
    raw = autoscaling(cold_start_price_s=550.0, trust=0.7)
    smooth = autoscaling(cold_start_price_s=550.0, trust=0.7, smoothing=1.0)
    spiky = keep_alive_window(histogram(gaps, raw.keep_alive_histogram), raw)
    assert (spiky.prewarm_after_s, spiky.keep_until_s) == (1320.0, 1500.0)
    spread = keep_alive_window(histogram(gaps, smooth.keep_alive_histogram), smooth)
    assert spread.prewarm_after_s is not None and spread.prewarm_after_s > max(gaps)
    # A regular model keeps its detail: thirty gaps of 630 s have no spread to smooth by
    # (only SPREAD_PRIOR_N's), so it is pre-warmed as before, at 540 s.
    regular = keep_alive_window(histogram([630.0] * 30, smooth.keep_alive_histogram), smooth)
    assert regular.prewarm_after_s == keep_alive_window(histogram([630.0] * 30), raw).prewarm_after_s == 540.0


def test_smoothing_keeps_a_cluster_that_has_the_intervals_to_show_it() -> None:
    # Thirty gaps: a cron every 25 min (1,500 s, jitter of seconds) and, between, bursts
    # of short gaps (15 quantiles of an exponential of mean 300 s), priced at 950 s. The
    # bursts spread the logs (so the width) wide; the cron is a cluster of 15. Counted as
    # they are, the window lets go and pre-warms for the cron. Smoothed, it still must:
    # with a width that shrinks as n ** -0.2 the cluster was smeared into "anything from
    # minutes to hours", and the window let go with no pre-warm before the range's end,
    # making every cron request a cold start.
    bursts = [300.0 * -math.log(1 - (i + 0.5) / 15) for i in range(15)]
    cron = [1500.0 + d for d in (-40, -30, -25, -20, -15, -10, -5, 0, 5, 10, 15, 20, 25, 30, 40)]
    raw = autoscaling(cold_start_price_s=950.0, trust=0.7)
    smooth = autoscaling(cold_start_price_s=950.0, trust=0.7, smoothing=1.0)
    exact = keep_alive_window(histogram(bursts + cron, raw.keep_alive_histogram), raw)
    assert (exact.prewarm_after_s, exact.keep_until_s) == (1380.0, 1560.0)
    window = keep_alive_window(histogram(bursts + cron, smooth.keep_alive_histogram), smooth)
    assert window.prewarm_after_s is not None and window.prewarm_after_s < min(cron) < max(cron) < window.keep_until_s
    silverman = autoscaling(cold_start_price_s=950.0, trust=0.7, smoothing=1.0, smoothing_exponent=0.2)
    smeared = keep_alive_window(histogram(bursts + cron, silverman.keep_alive_histogram), silverman)
    assert smeared.prewarm_after_s == 14_340.0  # let go; the "pre-warm" is at the range's end


def test_smoothing_keeps_every_interval_and_counts_what_spills_past_the_range_as_out_of_range() -> None:
    cfg = KeepAliveHistogram(smoothing=1.0)
    h = histogram([657.0, 1802.0, 33.0, 2026.0, 8196.0, 3149.0, 840.0, 20_000.0], cfg)
    counts, oor, oor_s = _smoothed(_in_range(h, cfg, _bin_count(cfg)), cfg)
    assert sum(counts) + oor == pytest.approx(h.total())
    # The 20,000 s gap stays out of range; part of the 8,196 s one spills past 4 h, each
    # part at a length past the range.
    assert 1.0 < oor < 2.0 and oor_s > 20_000.0 + (oor - 1.0) * cfg.range_s
    # Off, the counts are as they were.
    off = KeepAliveHistogram(smoothing=0.0)
    assert _smoothed(_in_range(h, off, _bin_count(off)), off) == _in_range(h, off, _bin_count(off))


def test_the_prior_floor_keeps_weight_on_gaps_longer_than_any_seen() -> None:
    # A model whose 30 gaps were all 30 s, in a fleet whose gaps run to 2 h, priced at 4 h:
    # with the floor it holds past its own longest gap, without it it does not.
    a = autoscaling(cold_start_price_s=4 * 3600.0, prewarm=False)
    own = histogram([30.0] * 30)
    prior = histogram([30.0] * 50 + [7000.0] * 50)
    assert keep_alive_window(own, a, prior).keep_until_s == 7020.0
    assert keep_alive_window(own, autoscaling(cold_start_price_s=4 * 3600.0, prewarm=False,
                                              prior_floor=0.0), prior).keep_until_s == 60.0


def test_bins_past_a_shrunk_range_count_as_out_of_range() -> None:
    # Recorded with the 4 h range; read with a 1000 s range: the gaps at 2000 s are out of
    # range now, each counted at its bin's lower edge (1980 s): priced at 2500 s, holding
    # across them (1980 < 2500) is kept, until the next request.
    h = histogram([2000.0] * 6)
    window = keep_alive_window(h, autoscaling(range_s=1000.0, cold_start_price_s=2500, prewarm=False))
    assert window.keep_until_s == INF
    # At 1500 s a cold start is cheaper than 1980 s held.
    window = keep_alive_window(h, autoscaling(range_s=1000.0, cold_start_price_s=1500, prewarm=False))
    assert window.keep_until_s == 0.0


def test_fixed_config_ignores_a_learnt_histogram() -> None:
    h = histogram([630.0] * 100)
    window = keep_alive_window(h, autoscaling(keep_alive="fixed", idle_grace_s=120.0), h)
    assert window == KeepAliveWindow("fixed", "fixed keep-alive (config)", None, 120.0)
    assert keep_alive_window(IdleHistogram(), autoscaling(keep_alive="fixed")).keep_until_s == 300.0


def brute_force_cost(counts: list[float], oor: float, oor_s: float, cfg: KeepAliveHistogram, price: float,
                     prewarm_after_s: float | None, keep_until_s: float) -> float:
    """The expected cost of a window, bin by bin (each bin's gaps at its midpoint): held
    idle time plus ``price`` per cold start."""
    lo = 0.0 if prewarm_after_s is None else prewarm_after_s
    ready = 0.0 if prewarm_after_s is None else prewarm_after_s + cfg.prewarm_lead_s
    cost = 0.0
    for i, c in enumerate(counts):
        g = (i * cfg.bin_s + min((i + 1) * cfg.bin_s, cfg.range_s)) / 2
        edge = i * cfg.bin_s
        if edge < ready:
            cost += c * price  # ended before the replica was back
        elif edge < keep_until_s:
            cost += c * (g - lo)
        else:
            cost += c * (keep_until_s - lo + price)
    if keep_until_s == math.inf:
        cost += oor_s - lo * oor
    else:
        cost += oor * (keep_until_s - lo + price)
    return cost


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1500, allow_nan=False), min_size=1, max_size=40),
       st.floats(min_value=1, max_value=3000), st.booleans())
def test_the_window_is_the_cheapest_of_every_window_on_its_bins(samples: list[float], price: float,
                                                                prewarm: bool) -> None:
    # 20 bins of 60 s up to 1200 s: every (pre-warm edge, keep edge or forever) judged by
    # brute force; the window chosen costs no more than any of them.
    a = autoscaling(bin_s=60.0, range_s=1200.0, cold_start_price_s=price, prewarm=prewarm)
    cfg = a.keep_alive_histogram
    h = histogram(samples, cfg)
    window = keep_alive_window(h, a)
    counts = [float(c) for c in h.counts] + [0.0] * (20 - len(h.counts))
    args = (counts, float(h.out_of_range), h.out_of_range_s, cfg, price)
    chosen = brute_force_cost(*args, window.prewarm_after_s, window.keep_until_s)
    keeps = [k * 60.0 for k in range(21)] + [math.inf]
    starts: list[float | None] = [None] + ([p * 60.0 - 60.0 for p in range(2, 21)] if prewarm else [])
    best = min(brute_force_cost(*args, p, k) for p in starts for k in keeps if p is None or p + 60.0 <= k)
    assert chosen == pytest.approx(best, rel=1e-9, abs=1e-6)
    if window.prewarm_after_s is not None:
        assert 0 < window.prewarm_after_s < window.keep_until_s


@pytest.mark.parametrize(("mean_gap_s", "price", "kept"), [
    # Exponential (memoryless) gaps: a held replica's chance of being used does not grow
    # with time held, so the best is all or nothing: let go at once when the price is
    # under the mean gap, hold on when it is over.
    (3600.0, 300.0, False),
    (60.0, 3000.0, True),
])
def test_memoryless_gaps_are_held_all_or_nothing(mean_gap_s: float, price: float, kept: bool) -> None:
    rng = random.Random(5)
    gaps = [rng.expovariate(1.0 / mean_gap_s) for _ in range(400)]
    window = keep_alive_window(histogram(gaps), autoscaling(cold_start_price_s=price, prewarm=False))
    if kept:
        assert all(g < window.keep_until_s for g in gaps)
    else:
        assert window.keep_until_s == 0.0


# --- trust: bounds on the learned window ---------------------------------------------

def test_trust_one_is_the_fixed_timeout_and_zero_the_histogram_alone() -> None:
    h = histogram([30.0] * 20 + [20000.0] * 5)
    # The histogram alone lets go once the short gaps are over.
    assert keep_alive_window(h, autoscaling(prewarm=False)).keep_until_s == 60.0
    # Trust 1: exactly the fixed timeout at the price, whatever the histogram says.
    fixed = keep_alive_window(h, autoscaling(trust=1.0))
    assert (fixed.prewarm_after_s, fixed.keep_until_s) == (None, 300.0)
    # Trust 0.7: not before 210 s, so the first edge past it; the reason says the bounds.
    bounded = keep_alive_window(h, autoscaling(prewarm=False, trust=0.7))
    assert bounded.keep_until_s == 240.0 and bounded.reason.endswith("; trust 0.7: held 210-429 s")


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(0, 30_000), min_size=1, max_size=40), price=st.floats(1, 20_000),
       prewarm=st.booleans())
def test_trust_one_is_the_fixed_timeout_at_the_price_whatever_the_gaps(
        gaps: list[float], price: float, prewarm: bool) -> None:
    a = autoscaling(cold_start_price_s=price, trust=1.0, prewarm=prewarm)
    window = keep_alive_window(histogram(gaps, a.keep_alive_histogram), a)
    assert (window.prewarm_after_s, window.keep_until_s) == (None, price)


def test_trust_keeps_a_pre_warm_that_comes_late_enough() -> None:
    # Gaps of 10 minutes at a price of 5: the histogram lets go at once and comes back
    # 60 s before the gaps end; 540 s is past 0.7 x 300, so trust keeps that window.
    h = histogram([610.0] * 20)
    alone = keep_alive_window(h, autoscaling())
    bounded = keep_alive_window(h, autoscaling(trust=0.7))
    assert (alone.prewarm_after_s, alone.keep_until_s) == (540.0, 660.0) == (
        bounded.prewarm_after_s, bounded.keep_until_s)
    # Without pre-warm, the histogram lets go at once; trust holds for 210 s first.
    assert keep_alive_window(h, autoscaling(prewarm=False)).keep_until_s == 0.0
    assert keep_alive_window(h, autoscaling(prewarm=False, trust=0.7)).keep_until_s == 240.0
    # A pre-warm earlier than trust x price is not asked for: gaps of 2 minutes would
    # pre-warm at 60 s, which trust 0.7 at a price of 300 s does not allow.
    short = histogram([125.0] * 20)
    early = keep_alive_window(short, autoscaling())
    assert (early.prewarm_after_s, early.keep_until_s) == (60.0, 180.0)
    late = keep_alive_window(short, autoscaling(trust=0.7))
    assert (late.prewarm_after_s, late.keep_until_s) == (None, 240.0)


def test_trust_caps_how_long_a_replica_is_held() -> None:
    # Gaps of 30 s and of 650 s at a price of 600 s: past the short gaps, holding on to
    # 660 s costs less than letting go at 60 s and paying a cold start.
    h = histogram([30.0] * 10 + [650.0] * 10)
    assert keep_alive_window(h, autoscaling(cold_start_price_s=600.0, prewarm=False)).keep_until_s == 660.0
    # Trust 0.95: never past 600 / 0.95 = 631.6 s.
    assert keep_alive_window(h, autoscaling(cold_start_price_s=600.0, prewarm=False,
                                            trust=0.95)).keep_until_s == 600.0
    # "Until the next request" becomes price / trust at most: gaps past range_s (1 h)
    # but shorter than the price (2 h) are worth holding across.
    cfg = KeepAliveHistogram(range_s=3600.0)
    h = histogram([20.0] * 50 + [5000.0] * 5, cfg)
    forever = keep_alive_window(h, autoscaling(cold_start_price_s=7200.0, prewarm=False, range_s=3600.0))
    assert forever.keep_until_s == math.inf
    bounded = keep_alive_window(h, autoscaling(cold_start_price_s=7200.0, prewarm=False, range_s=3600.0, trust=0.5))
    assert bounded.keep_until_s == 14400.0


@settings(max_examples=300, deadline=None)
@given(gaps=st.lists(st.floats(0, 30_000), max_size=40), price=st.floats(30, 7200),
       trust=st.sampled_from([0.2, 0.5, 0.7, 1.0]), probe=st.lists(st.floats(0, 100_000), min_size=1, max_size=20))
def test_a_bounded_window_costs_at_most_one_plus_one_over_trust_times_the_best(
        gaps: list[float], price: float, trust: float, probe: list[float]) -> None:
    # Any history, any gap: holding from the idle start until K costs the gap itself if
    # it ends first, else K and a cold start; the best possible is min(gap, price).
    a = autoscaling(idle_grace_s=price, prewarm=False, trust=trust)  # no history: fixed at the price
    window = keep_alive_window(histogram(gaps, a.keep_alive_histogram), a)
    k = window.keep_until_s
    for g in probe + [k, max(0.0, k - 1e-6), k + 1e-6]:
        cost = g if g < k else k + price
        assert cost <= (1 + 1 / trust) * min(g, price) + 1e-6, (g, window)


# --- the pooled prior ---------------------------------------------------------------

KEY = pool_key(CFG)


def pooled_of(h: IdleHistogram, scale: float = 1.0) -> PooledCounts:
    return PooledCounts(tuple(scale * c for c in h.counts), scale * h.out_of_range, scale * h.out_of_range_s)


def test_pooled_sums_each_model_once_and_follows_their_changes() -> None:
    a, b = histogram([30.0, 630.0]), histogram([630.0, 20000.0])
    pools = pooled(IdlePools(), {"a": (KEY, a), "b": (KEY, b)}, now=1.0)
    assert pools.pools[KEY] == pooled_of(histogram([30.0, 630.0, 630.0, 20000.0]))
    # The prior a model reads is the others' intervals.
    assert pools.prior("a", KEY) == pooled_of(b) and pools.prior("b", KEY) == pooled_of(a)
    assert pools.prior("new", KEY) == pools.pools[KEY]
    # The same tick again: unchanged (the tick's start is what every judgement reads).
    a2 = record_idle(a, 90.0, CFG)
    assert pooled(pools, {"a": (KEY, a2), "b": (KEY, b)}, now=1.0) is pools
    # A later tick: a's new interval is in, b gone is out.
    later = pooled(pools, {"a": (KEY, a2)}, now=2.0)
    assert later.pools[KEY] == pooled_of(a2) and later.prior("a", KEY) == PooledCounts()
    # Models that bin differently pool apart.
    other = KeepAliveHistogram(bin_s=30.0)
    split = pooled(later, {"a": (KEY, a2), "c": (pool_key(other), histogram([45.0], other))}, now=3.0)
    assert split.pools[KEY] == pooled_of(a2) and split.pools[pool_key(other)].counts == (0.0, 1.0)


def test_a_busy_model_weighs_in_the_pool_as_much_as_prior_model_weight() -> None:
    # A busy model: 1,000 gaps of 30 s and 20 nights; a sparse one: two gaps of 20 min.
    busy, sparse = histogram([30.0] * 1000 + [20000.0] * 20), histogram([1200.0, 1200.0])
    pools = pooled(IdlePools(), {"busy": (KEY, busy), "sparse": (KEY, sparse)}, now=1.0)
    prior = pools.prior("new", KEY)
    # The busy model's 1,020 intervals count as 10 (the default), the sparse one's as 2.
    assert prior.total() == pytest.approx(12.0) and prior.counts[20] == pytest.approx(2.0)
    assert pools.prior("sparse", KEY) == pooled_of(busy, 10 / 1020)
    # At a price of 30 minutes a new model holds its replica across gaps like the sparse
    # model's: weighed by intervals, the busy model's 20 nights (a 20-minute hold each,
    # then a cold start anyway) outweigh them and it would let go after 60 s.
    a = autoscaling(cold_start_price_s=1800.0, prewarm=False)
    assert keep_alive_window(IdleHistogram(), a, prior).keep_until_s == 1260.0
    every = KeepAliveHistogram(prior_model_weight=None)
    by_interval = pooled(IdlePools(), {"busy": (pool_key(every), busy), "sparse": (pool_key(every), sparse)}, 1.0)
    everyone = by_interval.prior("new", pool_key(every))
    assert everyone == pooled_of(histogram([30.0] * 1000 + [20000.0] * 20 + [1200.0] * 2))
    assert keep_alive_window(IdleHistogram(), autoscaling(cold_start_price_s=1800.0, prewarm=False,
                                                          prior_model_weight=None), everyone).keep_until_s == 60.0
    # Taking a model out leaves no residue of its weighted counts.
    gone = pooled(pools, {"sparse": (KEY, sparse)}, now=2.0)
    assert gone.pools[KEY] == pooled_of(sparse) and gone.prior("sparse", KEY) == PooledCounts()


def test_price_tiers() -> None:
    shape = {"name": "gpu", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 48, "host_memory_gib": 64,
             "price_per_hour_usd": 2.0}
    cfg = parse_config({
        "controller": {"url": "http://controller.internal:8100"}, "shapes": [shape],
        "pools": [{"shape": "gpu", "prebuild": ["m1"]}],
        "models": [{"name": f"m{i}", "uri": f"s3://thaw/m{i}", "shape": "gpu"} for i in range(2)]})
    base = cfg.models[0]
    assert price_tier(base, cfg) == "launch"
    assert price_tier(cfg.models[1], cfg) == "swap"
    adapter = base.model_copy(update={"name": "ad", "base": base.name})
    assert price_tier(adapter, cfg) == "adapter"
    a = autoscaling(idle_grace_s=400.0)
    assert [cold_start_price_s(a, t) for t in ("launch", "swap", "adapter")] == [400.0, 100.0, 20.0]


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
    # bins 9 (540-600) and 10 (600-660).
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += 600.0 + rng.uniform(-20.0, 20.0)
        out.append(t)
    return out


def test_regular_trace_is_prewarmed_and_cheaper_than_a_fixed_ten_minutes() -> None:
    trace = regular_trace()
    # A cold start priced at the fixed policy's 10 minutes, so only the policy differs.
    hist_a = autoscaling(idle_grace_s=600.0)
    warmup = 10
    hist = replay(trace, hist_a, warmup)
    fixed = replay(trace, autoscaling(keep_alive="fixed", idle_grace_s=600.0), warmup)

    # Fixed for the first gap only (nothing learnt yet), then pre-warmed: asked for 60 s
    # before bin 9's edge (540 - 60 = 480 s), kept past the gaps' end.
    assert hist.windows[0].mode == "fixed"
    assert all(w.mode == "histogram" and w.prewarm_after_s == pytest.approx(480.0) and w.keep_until_s >= 615
               for w in hist.windows[warmup:])
    warm_share = hist.warm / hist.arrivals
    fixed_share = fixed.warm / fixed.arrivals
    per_gap = hist.replica_s / hist.arrivals
    fixed_per_gap = fixed.replica_s / fixed.arrivals
    print(f"\nregular trace, {hist.arrivals} arrivals after warm-up: histogram warm {warm_share:.1%}, "
          f"{hist.replica_s:.0f} replica-s ({per_gap:.0f}/gap); fixed 600 s warm {fixed_share:.1%}, "
          f"{fixed.replica_s:.0f} replica-s ({fixed_per_gap:.0f}/gap)")
    assert warm_share == 1.0
    # Held from 480 s to the arrival (575..615 s): about 115 s a gap, against about
    # min(idle, 600) = 593 s for the fixed 10 minutes.
    assert hist.replica_s < 0.3 * fixed.replica_s
    assert per_gap <= 615 - 480 + TICK_S


# --- time of day (periodic) -----------------------------------------------------------

DAY_S, HOUR_S = 86_400.0, 3_600.0
# Bins of 10 min up to a day: an idle start after hours can see the morning.
DAILY = KeepAliveHistogram(bin_s=600, range_s=DAY_S, periodic="day", period_slots=24, trust=0.0, smoothing=0.0)


@pytest.mark.parametrize(("periodic", "slots", "at", "slot"), [
    ("off", 24, 5 * HOUR_S, None),
    ("day", 24, 0.0, 0),
    ("day", 24, DAY_S - 0.001, 23),
    ("day", 24, DAY_S, 0),                      # the next day's first slot
    ("day", 24, 3 * DAY_S + 9.5 * HOUR_S, 9),  # any day: the time of day counts
    ("day", 48, 9.5 * HOUR_S, 19),             # half-hour slots
    ("week", 7, 0.0, 0),                       # t = 0, a Thursday (the Unix epoch)
    ("week", 7, 8 * DAY_S + HOUR_S, 1),        # a week and a day later: the second day's slot
], ids=repr)
def test_slot_of(periodic: str, slots: int, at: float, slot: int | None) -> None:
    cfg = KeepAliveHistogram(periodic=periodic, period_slots=slots)  # type: ignore[arg-type]
    assert slot_of(at, cfg) == slot


def test_each_interval_is_also_counted_in_the_slot_it_began_in() -> None:
    h = record_idle(IdleHistogram(), 900.0, DAILY, began_at=2 * DAY_S + 3.5 * HOUR_S)
    h = record_idle(h, 90_000.0, DAILY, began_at=18 * HOUR_S)
    assert h.total() == 2 and h.out_of_range == 1
    assert len(h.by_slot) == 19 and h.slot(3).counts == (0, 1) and h.slot(18).out_of_range == 1
    assert [i for i in range(24) if h.slot(i).total()] == [3, 18]
    # Off, or with no start given, there are no slots.
    assert record_idle(IdleHistogram(), 900.0, CFG, began_at=3.5 * HOUR_S).by_slot == ()
    assert record_idle(IdleHistogram(), 900.0, DAILY).by_slot == ()


def office_hours(days: int, cfg: KeepAliveHistogram) -> IdleHistogram:
    """A model used 09:00-18:00: every hour of the day an idle interval of 5 min, and
    each evening at 18:00 one of 15 h, to the next morning."""
    h = IdleHistogram()
    for d in range(days):
        for hour in range(9, 18):
            h = record_idle(h, 300.0, cfg, began_at=d * DAY_S + hour * HOUR_S + 60)
        h = record_idle(h, 15 * HOUR_S, cfg, began_at=d * DAY_S + 18 * HOUR_S)
    return h


def test_an_evening_idle_start_lets_go_and_prewarms_for_the_morning() -> None:
    a = autoscaling(idle_grace_s=3600.0, **DAILY.model_dump())
    h = office_hours(10, DAILY)
    day = keep_alive_window(h, a, idle_since=10 * DAY_S + 11 * HOUR_S)
    evening = keep_alive_window(h, a, idle_since=10 * DAY_S + 18 * HOUR_S)
    # By day the short gaps are held across; the evening's 15 h are let go at once and a
    # replica is back (60 s ahead) when the bin holding 15 h begins.
    assert day.prewarm_after_s is None and 300 <= day.keep_until_s <= 1200
    assert evening.prewarm_after_s == 15 * HOUR_S - 60 and evening.keep_until_s > 15 * HOUR_S
    assert "10 intervals begun in slot 18" in evening.reason
    # Without the time of day, the evening is judged as any other idle start: held a
    # little, then the morning is a cold start.
    blind = autoscaling(idle_grace_s=3600.0, **DAILY.model_dump(exclude={"periodic"}))
    assert keep_alive_window(h, blind, idle_since=10 * DAY_S + 18 * HOUR_S) == \
        keep_alive_window(h, blind, idle_since=10 * DAY_S + 11 * HOUR_S)
    assert keep_alive_window(h, blind, idle_since=10 * DAY_S + 18 * HOUR_S).prewarm_after_s is None


def test_a_slot_with_few_intervals_leans_on_the_models_others() -> None:
    a = autoscaling(idle_grace_s=3600.0, **DAILY.model_dump())
    h = office_hours(10, DAILY)
    # One interval begun at 03:00, of 15 h: the slot has 1, the model's 100 weigh in as 9.
    h = record_idle(h, 15 * HOUR_S, DAILY, began_at=3 * HOUR_S)
    night = keep_alive_window(h, a, idle_since=11 * DAY_S + 3 * HOUR_S)
    assert "1 intervals begun in slot 3, the model's x9" in night.reason
    assert night.prewarm_after_s is None  # nine in ten of what it reads are 5 min gaps
    # A slot nothing began in reads the model's alone (a slot-blind window).
    assert keep_alive_window(h, a, idle_since=11 * DAY_S + 5 * HOUR_S).keep_until_s == \
        keep_alive_window(h, autoscaling(idle_grace_s=3600.0, **DAILY.model_dump(exclude={"periodic"}))).keep_until_s


# --- persistence -----------------------------------------------------------------


def test_json_round_trip() -> None:
    h = histogram([0.0, 630.0, 630.0, 14399.0, 20000.0])
    data = json.loads(json.dumps(h.to_json()))
    assert data == {"counts": [1] + [0] * 9 + [2] + [0] * 228 + [1], "out_of_range": 1, "out_of_range_s": 20000.0}
    assert IdleHistogram.from_json(data, CFG) == h
    assert IdleHistogram.from_json(IdleHistogram().to_json()) == IdleHistogram()
    # As written before the out-of-range seconds were kept: none.
    assert IdleHistogram.from_json({"counts": [1], "out_of_range": 2}) == IdleHistogram((1,), 2, 0.0)


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
    {"counts": [1], "out_of_range": 1, "out_of_range_s": -1.0},
    {"counts": [1], "out_of_range": 1, "out_of_range_s": "1"},
    {"counts": [1], "out_of_range": 1, "out_of_range_s": True},
], ids=repr)
def test_from_json_rejects_garbage(data: Any) -> None:
    with pytest.raises(ValueError):
        IdleHistogram.from_json(data, CFG)


def test_json_round_trip_with_slots() -> None:
    h = office_hours(2, DAILY)
    data = json.loads(json.dumps(h.to_json()))
    assert len(data["by_slot"]) == 19 and "by_slot" not in data["by_slot"][18]
    assert IdleHistogram.from_json(data, DAILY) == h
    # More slots than the period has, or slots of slots, are refused.
    with pytest.raises(ValueError, match="slots"):
        IdleHistogram.from_json(data, DAILY.model_copy(update={"period_slots": 12}))
    with pytest.raises(ValueError, match="slots"):
        IdleHistogram.from_json({**data, "by_slot": [data]}, DAILY)
    with pytest.raises(ValueError):
        IdleHistogram.from_json({**data, "by_slot": "18"}, DAILY)


def test_from_json_bin_limit_needs_the_config() -> None:
    data = {"counts": [0] * 241, "out_of_range": 0}
    assert len(IdleHistogram.from_json(data).counts) == 241
    assert len(IdleHistogram.from_json({"counts": [0] * 240, "out_of_range": 0}, CFG).counts) == 240


def test_constructor_validates_too() -> None:
    with pytest.raises(ValueError):
        IdleHistogram((1, -2))
    with pytest.raises(ValueError):
        IdleHistogram([1, 2])  # type: ignore[arg-type]
