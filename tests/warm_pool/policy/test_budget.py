"""Budget grants: asks in, grants out, never over a budget except by serving replicas."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from thaw.config import Pool
from warm_pool.policy.budget import PoolAsk, PoolGrant, grant, micro_usd
from warm_pool.policy.sizer import SizerState, size_standby


def ask(shape: str = "gpu", price: float = 1.0, serving: int = 0, asleep: int = 0,
        wanted: int = 0, budget: float | None = None, max_instances: int = 10,
        standby_min: int = 0) -> PoolAsk:
    return PoolAsk(shape, price, serving, asleep, wanted, budget, max_instances, standby_min)


def summary(g: PoolGrant) -> tuple[int, int, int, float, bool, str]:
    return (g.standby, g.asleep_allowed, g.shortfall, g.spend_usd_per_hour,
            g.over_budget_serving, g.reason)


@pytest.mark.parametrize(
    ("asks", "total", "expected"),
    [
        pytest.param(
            # budget 6 - 1 serving x 2 = 4 left, / 2 = 2 of the 3 standbys wanted;
            # spend (1 + 2) x 2 = 6
            [ask(price=2.0, serving=1, wanted=3, budget=6.0)], None,
            [(2, 0, 1, 6.0, False, "pool_budget")], id="pool_budget_binds"),
        pytest.param(
            # global 7, cheapest first, round-robin: a 1 (6 left), b 3 (3 left),
            # a 1 (2 left), b 3 > 2 drops out, a 1 (1 left) -> a 3, b 1; spend 3 + 3 = 6
            [ask("a", price=1.0, wanted=3), ask("b", price=3.0, wanted=3)], 7.0,
            [(3, 0, 0, 3.0, False, "ok"), (1, 0, 2, 3.0, False, "global_budget")],
            id="global_binds_across_two_prices"),
        pytest.param(
            # the same, listed the other way round: the order of asks does not matter
            [ask("b", price=3.0, wanted=3), ask("a", price=1.0, wanted=3)], 7.0,
            [(1, 0, 2, 3.0, False, "global_budget"), (3, 0, 0, 3.0, False, "ok")],
            id="global_binds_order_free"),
        pytest.param(
            # 4 serving x 2 = 8 > budget 6: reported, kept; nothing else fits; spend 8
            [ask(price=2.0, serving=4, asleep=1, wanted=1, budget=6.0)], None,
            [(0, 0, 1, 8.0, True, "pool_budget")], id="serving_over_pool_budget_reported_not_cut"),
        pytest.param(
            # serving 3 x 1 + 2 x 1 = 5 > global 4: both flagged, neither cut
            [ask("a", serving=3, wanted=1), ask("b", serving=2)], 4.0,
            [(0, 0, 1, 3.0, True, "global_budget"), (0, 0, 0, 2.0, True, "ok")],
            id="serving_over_global_budget_reported_not_cut"),
        pytest.param(
            # budget 4 - 1 serving = 3 left: standby 2 first, then 1 of the 2 asleep
            # (the caller releases the other); spend 1 + 1 + 2 = 4
            [ask(serving=1, asleep=2, wanted=2, budget=4.0)], None,
            [(2, 1, 0, 4.0, False, "pool_budget")], id="asleep_cut_before_standby"),
        pytest.param(
            # global 2, nothing serving: both standbys, no room for the asleep one
            [ask(asleep=1, wanted=2)], 2.0,
            [(2, 0, 0, 2.0, False, "global_budget")], id="asleep_cut_by_global_budget"),
        pytest.param(
            # price 0 x anything = 0 <= budget 0, global 0
            [ask(price=0.0, serving=2, asleep=2, wanted=3, budget=0.0)], 0.0,
            [(3, 2, 0, 0.0, False, "ok")], id="zero_price_never_binds"),
        pytest.param(
            # 2 serving + 1 asleep + 3 standby > max 4: 4 - 2 = 2 standby, 0 asleep;
            # spend (2 + 2) x 1 = 4
            [ask(serving=2, asleep=1, wanted=3, max_instances=4)], None,
            [(2, 0, 1, 4.0, False, "max_instances")], id="max_instances_bounds"),
        pytest.param(
            # 3 x $0.10 fits $0.30 in micro-dollars (300000 <= 300000), not in floats
            [ask(price=0.1, wanted=4, budget=0.3)], None,
            [(3, 0, 1, 3 * 0.1, False, "pool_budget")], id="decimal_budget_fits_exactly"),
        pytest.param(
            # no budget anywhere: all that is wanted, within max_instances
            [ask(price=5.0, serving=1, asleep=2, wanted=3)], None,
            [(3, 2, 0, 30.0, False, "ok")], id="unlimited"),
        pytest.param(
            # global 4 at 1 each; b's floor of 3 is shared before a's 4 above its floor
            # of 1: floors a 1, b 3 (0 left) -> a 1, b 3
            [ask("a", wanted=5, standby_min=1), ask("b", wanted=3, standby_min=3)], 4.0,
            [(1, 0, 4, 1.0, False, "global_budget"), (3, 0, 0, 3.0, False, "ok")],
            id="floors_before_the_rest"),
    ],
)
def test_grant(asks: list[PoolAsk], total: float | None,
               expected: list[tuple[int, int, int, float, bool, str]]) -> None:
    grants = grant(asks, total)
    assert [g.shape for g in grants] == [a.shape for a in asks]
    assert [summary(g) for g in grants] == expected


@pytest.mark.parametrize(
    "bad",
    [{"price": -1.0}, {"price": float("inf")}, {"budget": -0.5}, {"budget": float("nan")},
     {"serving": -1}, {"wanted": -2}],
)
def test_ask_rejects_impossible_values(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="gpu"):
        ask(**bad)


def test_no_asks_no_grants() -> None:
    assert grant([], 10.0) == []


# -- properties ------------------------------------------------------------------------

# Round prices and budgets make budgets bind exactly and often; arbitrary floats test
# the rounding to micro-dollars.
prices = st.one_of(st.sampled_from([0.0, 0.1, 0.25, 1.0, 3.0]),
                   st.floats(0, 50, allow_nan=False, allow_infinity=False))
budgets = st.one_of(st.none(), st.integers(0, 40).map(lambda n: n / 4),
                    st.floats(0, 500, allow_nan=False, allow_infinity=False))
asks_st = st.lists(
    st.builds(ask, shape=st.sampled_from(["a", "b", "c"]), price=prices,
              serving=st.integers(0, 8), asleep=st.integers(0, 8), wanted=st.integers(0, 12),
              budget=budgets, max_instances=st.integers(1, 20), standby_min=st.integers(0, 4)),
    max_size=4,
)


@settings(max_examples=200, deadline=None, database=None)
@given(asks_st, budgets)
def test_grants_stay_within_every_budget_and_cap(asks: list[PoolAsk], total: float | None) -> None:
    grants = grant(asks, total)
    # Spend is compared in the module's unit, whole micro-dollars per hour (see budget.py):
    # standby + asleep spend <= max(0, budget - serving spend), for each pool's budget and
    # for the global one. Only serving replicas may push a pool's spend past a budget.
    extra = []
    for a, g in zip(asks, grants, strict=True):
        p = micro_usd(a.price_per_hour_usd)
        assert 0 <= g.standby <= a.standby_wanted and 0 <= g.asleep_allowed <= a.asleep
        assert g.shortfall == a.standby_wanted - g.standby
        assert a.serving + g.standby + g.asleep_allowed <= max(a.max_instances, a.serving)
        extra.append((g.standby + g.asleep_allowed) * p)
        if a.budget_usd_per_hour is not None:
            assert extra[-1] <= max(0, micro_usd(a.budget_usd_per_hour) - a.serving * p)
            if a.serving * p > micro_usd(a.budget_usd_per_hour):
                assert g.over_budget_serving
    if total is not None:
        serving = sum(a.serving * micro_usd(a.price_per_hour_usd) for a in asks)
        assert sum(extra) <= max(0, micro_usd(total) - serving)


# Half-dollar prices and budgets: the floors fit exactly, or just do not, often enough.
halves = st.integers(0, 30).map(lambda n: n / 2)
pool_specs = st.tuples(
    st.integers(0, 3), st.integers(0, 3),           # standby_min, standby_max - standby_min
    st.integers(0, 3), st.integers(0, 4),           # max_instances headroom, serving
    st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.one_of(st.none(), halves),  # price, pool budget
    st.lists(st.integers(0, 12).map(lambda q: q / 4), min_size=1, max_size=6),  # cold starts/min
)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(pool_specs, min_size=1, max_size=3), st.one_of(st.integers(-1, 2), st.none()))
# Always tried: s0 (floor 0, 2/min x 120 s / 60 = 4 -> its max 3) and s1 (floor 2) at
# $1/h, global $2/h = s1's floor. Floors first: s0 0, s1 2. Plain round-robin would
# give s0 1, s1 1 ($0 left): s1 under its floor though the budget could pay it.
@example([(0, 3, 0, 0, 1.0, None, [2.0]), (2, 0, 0, 0, 1.0, None, [0.0])], 0)
def test_sizer_then_grant_keeps_the_floor_when_it_is_affordable(
    specs: list[tuple[int, int, int, int, float, float | None, list[float]]],
    slack: int | None,
) -> None:
    asks, pools = [], []
    for i, (lo, extra, head, serving, price, budget, rates) in enumerate(specs):
        pool = Pool(shape=f"s{i}", standby_min=lo, standby_max=lo + extra,
                    max_instances=max(lo + extra + head, 1), standby_hold_s=30.0)
        state, now = SizerState(), 0.0
        for r in rates:
            target, state = size_standby(state, cold_starts_per_min=r, boot_s=120.0, pool=pool, now=now)
            now += 10.0
        asks.append(ask(f"s{i}", price, serving, 0, target.target, budget, pool.max_instances,
                        pool.standby_min))
        pools.append(pool)
    # The global budget: None, or what serving and the floors cost, give or take a few
    # half-dollars (where sharing it decides who gets their floor).
    floors_usd = sum((a.serving + a.standby_min) * a.price_per_hour_usd for a in asks)
    total = None if slack is None else max(floors_usd + slack / 2, 0.0)
    grants = grant(asks, total)

    # The granted standby never exceeds the sizer's target, which is within the bounds.
    for a, g, pool in zip(asks, grants, pools, strict=True):
        assert g.standby <= a.standby_wanted <= pool.standby_max
        assert a.standby_wanted >= pool.standby_min

    # standby_min is a floor the budget may take away, but only when it cannot pay for
    # it. "Can pay" must hold for every pool at once: the global budget is shared, so one
    # pool's floor is guaranteed only when all floors fit. Then each pool's floor fits
    # its max_instances (serving + min <= max) and its own budget ((serving + min) x price
    # <= budget), and all floors fit the global budget together; the floors are shared
    # before anything above them, so every pool gets at least standby_min.
    def fits(a: PoolAsk) -> bool:
        p, need = micro_usd(a.price_per_hour_usd), a.serving + a.standby_min
        if need > a.max_instances:
            return False
        return a.budget_usd_per_hour is None or need * p <= micro_usd(a.budget_usd_per_hour)

    need_total = sum((a.serving + a.standby_min) * micro_usd(a.price_per_hour_usd) for a in asks)
    if all(fits(a) for a in asks) and (total is None or need_total <= micro_usd(total)):
        for a, g in zip(asks, grants, strict=True):
            assert g.standby >= a.standby_min
