"""Budgets that are never exceeded: how many standby and asleep instances each pool may keep.

Pure: one ``PoolAsk`` per pool goes in, one ``PoolGrant`` per pool (same order) comes
out. The caller launches up to ``standby``, and releases asleep replicas beyond
``asleep_allowed``.

Rules:
- serving replicas (models with traffic) are never cut: their spend is counted first,
  against the pool's budget and the global one, and a budget they alone exceed is
  reported (``over_budget_serving``), not enforced on them;
- what is left is granted to standby before asleep replicas: a standby serves a cold
  start of any model on the shape, an asleep replica only its own model's (and the
  policy already reclaims asleep workers when no standby is free). So when a budget
  binds, asleep replicas are cut first;
- ``max_instances`` bounds the pool too: serving + asleep + standby <= max_instances;
- the global budget, when it binds, is shared one instance at a time, round-robin over
  the pools, cheapest first (ties by shape name, then order): every shape gets one
  standby before any gets a second, and a tie goes to the instance that costs less. It
  is shared first up to each pool's ``standby_min``, then up to what each wants, then
  to asleep replicas;
- prices of 0 (below half a micro-dollar) never bind; a budget of None (or infinite)
  is unlimited. Stopped instances are not asked about: they cost storage only.

Money is counted in integer micro-dollars per hour: budgets are written in decimal, and
an operator who allows $0.30/h for three $0.10/h instances means three, while in binary
floating point 3 x 0.1 > 0.3. A micro-dollar is far below any instance price.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MICRO_USD = 1_000_000


def micro_usd(usd: float) -> int:
    """Dollars (per hour) as whole micro-dollars, rounded to the nearest."""
    return round(usd * MICRO_USD)


@dataclass(frozen=True)
class PoolAsk:
    """One pool's needs this tick. Counts are instances of the pool's shape."""

    shape: str
    price_per_hour_usd: float
    serving: int
    asleep: int
    standby_wanted: int
    budget_usd_per_hour: float | None
    max_instances: int
    # Shared before anything above it when the global budget binds (the sizer's floor).
    standby_min: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.price_per_hour_usd) and self.price_per_hour_usd >= 0):
            raise ValueError(f"{self.shape}: price_per_hour_usd must be finite and >= 0")
        if self.budget_usd_per_hour is not None and not self.budget_usd_per_hour >= 0:
            raise ValueError(f"{self.shape}: budget_usd_per_hour must be None or >= 0")
        counts = (self.serving, self.asleep, self.standby_wanted, self.max_instances, self.standby_min)
        if min(counts) < 0:
            raise ValueError(f"{self.shape}: instance counts must be >= 0")


@dataclass(frozen=True)
class PoolGrant:
    """What one pool may keep, and why."""

    shape: str
    standby: int
    asleep_allowed: int
    shortfall: int   # standby_wanted - standby (thaw_pool_budget_shortfall_instances{shape})
    spend_usd_per_hour: float       # serving + asleep + standby at the shape's price
    over_budget_serving: bool       # serving alone already exceeds a budget (reported, never cut)
    # ok | max_instances | pool_budget | global_budget: the first limit that cut this
    # pool's standby, else its asleep replicas.
    reason: str


def _budget(usd: float | None) -> int | None:
    return None if usd is None or math.isinf(usd) else micro_usd(usd)


def _local_cap(want: int, instances: int, affordable: int | None) -> tuple[int, str]:
    """At most ``want``, within the instance room and the pool budget's room."""
    cap, reason = want, "ok"
    if instances < cap:
        cap, reason = instances, "max_instances"
    if affordable is not None and affordable < cap:
        cap, reason = affordable, "pool_budget"
    return max(cap, 0), reason


def _share(order: list[int], caps: list[int], got: list[int], price: list[int],
           left: int | None) -> int | None:
    """Raise ``got`` toward ``caps`` one instance per pool per round, in ``order``,
    while the global budget ``left`` pays; returns what is left of it."""
    active = []
    for i in order:
        if left is None or price[i] == 0:
            got[i] = max(got[i], caps[i])
        elif got[i] < caps[i]:
            active.append(i)
    while active:
        still = []
        for i in active:
            # A pool that cannot pay now never can (left only falls): it drops out.
            if left is not None and price[i] <= left:
                got[i] += 1
                left -= price[i]
                if got[i] < caps[i]:
                    still.append(i)
        active = still
    return left


def grant(asks: Sequence[PoolAsk], total_budget_usd_per_hour: float | None) -> list[PoolGrant]:
    """Standby and asleep instances per pool within every budget and cap (see the module)."""
    n = len(asks)
    price = [micro_usd(a.price_per_hour_usd) for a in asks]
    serving = [a.serving * price[i] for i, a in enumerate(asks)]
    room = [max(a.max_instances - a.serving, 0) for a in asks]
    # What each pool's own budget leaves after serving, in instances (None: no limit).
    afford: list[int | None] = []
    pool_over = []
    for i, a in enumerate(asks):
        budget = _budget(a.budget_usd_per_hour)
        pool_over.append(budget is not None and serving[i] > budget)
        afford.append(None if budget is None or price[i] == 0
                      else max(budget - serving[i], 0) // price[i])
    total = _budget(total_budget_usd_per_hour)
    left = None if total is None else total - sum(serving)
    global_over = left is not None and left < 0
    order = sorted(range(n), key=lambda i: (price[i], asks[i].shape, i))

    limits = [_local_cap(a.standby_wanted, room[i], afford[i]) for i, a in enumerate(asks)]
    standby_caps = [cap for cap, _ in limits]
    standby_why = [why for _, why in limits]
    standby = [0] * n
    floors = [min(a.standby_min, standby_caps[i]) for i, a in enumerate(asks)]
    left = _share(order, floors, standby, price, left)
    left = _share(order, standby_caps, standby, price, left)

    asleep_caps, asleep_why = [], []
    for i, a in enumerate(asks):
        aff = afford[i]
        cap, why = _local_cap(a.asleep, room[i] - standby[i], None if aff is None else aff - standby[i])
        asleep_caps.append(cap)
        asleep_why.append(why)
    asleep = [0] * n
    _share(order, asleep_caps, asleep, price, left)

    grants = []
    for i, a in enumerate(asks):
        reason = "ok"
        if standby_why[i] != "ok":
            reason = standby_why[i]
        elif standby[i] < standby_caps[i]:
            reason = "global_budget"
        elif asleep_why[i] != "ok":
            reason = asleep_why[i]
        elif asleep[i] < asleep_caps[i]:
            reason = "global_budget"
        grants.append(PoolGrant(
            shape=a.shape,
            standby=standby[i],
            asleep_allowed=asleep[i],
            shortfall=a.standby_wanted - standby[i],
            spend_usd_per_hour=(a.serving + asleep[i] + standby[i]) * a.price_per_hour_usd,
            over_budget_serving=pool_over[i] or (global_over and serving[i] > 0),
            reason=reason,
        ))
    return grants
