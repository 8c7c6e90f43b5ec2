"""The learned keep-alive replayed on a trace's gaps, in the oracle's accounting: a fast
stand-in for a sweep, and the same yardstick as the oracle's columns.

    python -m loadtests.keepalive_replay --trace TRACE.csv [--trace ...] --out replay.json
        [--config examples/simulate.yaml] [--model-template template-8b]
        [--prices 60,120,200,300,450,600,900,1200,1800,3600] [--variant NAME:key=value,...]
        [--other-half]

Each trace's idle periods are what ``thaw simulate --oracle`` counts
(``simulator.oracle.gaps_of``: one replica per model, busy for each request's serving
time). They are replayed in the order they begin. At each one the model's window is
what ``keep_alive_window`` gives on the model's own intervals that have ended by then,
blended with every other model's that have (the pooled prior, as the controller keeps
it), at the price swept. The window is priced on the period as the oracle prices a
policy: the idle seconds it holds a replica, and a cold start where the request comes
before its pre-warm or after it lets go. A model's first request is a cold start, and
the wait for it, from the trace's start, is the model's first interval (as the
controller counts the wait from when it first saw the model).

What the simulator adds (load times, a pre-warm not ready when the request comes,
queueing, more than one replica) is left out, so a variant's figures here are its
keep-alive alone, on the same footing as the oracle and the per-model timeouts. Per
trace: each price's idle replica-hours and cold starts against the oracle's; and at the
idle time where a fixed timeout first has twice the oracle's cold starts, the learned
policy (interpolated between the prices either side), the per-model timeouts chosen in
hindsight and cross-fitted, over the oracle's. Each price also has its idle time and
cold starts by how many intervals of its own the model had at the idle start.

With ``--other-half`` every variant is also replayed with each model judged on the
other half of its gaps (its first half's periods on its second half's histogram, and
the other way round) instead of its own past: the policy with half a day of each
model's history, out of sample, as the cross-fitted timeouts have. The difference
between the two is what learning on the day costs.
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.keepalive_regret import load_gaps, parse_variant, window_outcome
from simulator.oracle import Gaps
from thaw.config import Autoscaling, KeepAliveHistogram
from warm_pool.policy.keepalive import (
    IdleHistogram,
    IdlePools,
    keep_alive_window,
    pool_key,
    pooled,
    record_idle,
)

PRICES_S = (60.0, 120.0, 200.0, 300.0, 450.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0)


# Classes of a model's own intervals at an idle start, for where a replay's cost lies.
OWN_CLASSES = ((0, 3), (3, 10), (10, 30), (30, 100), (100, None))


def own_class(n: int) -> str:
    """The class of ``n`` own intervals: ``"0-2"``, ``"3-9"``, ... ``"100+"``."""
    for low, high in OWN_CLASSES:
        if high is None or n < high:
            return f"{low}+" if high is None else f"{low}-{high - 1}"
    raise AssertionError("unreachable")


def replay(g: Gaps, price: float, cfg: KeepAliveHistogram, other_half: bool = False,
           by_class: dict[str, list[float]] | None = None) -> tuple[float, int]:
    """Idle replica-seconds and cold starts of ``keep_alive: histogram`` at ``price``
    over ``g``'s idle periods (see the module's docstring). With ``other_half`` each
    model is judged not on its own past but on the other half of its gaps (its first
    half's periods on its second half's, and the other way round): the policy with
    half a day of each model's history, out of sample. ``by_class`` (when given) gets,
    per class of the model's own intervals so far, [periods, idle seconds, cold starts]."""
    autoscaling = Autoscaling(keep_alive="histogram", idle_grace_s=price, keep_alive_histogram=cfg)
    key = pool_key(cfg)
    periods = sorted((float(at), float(gap), name, i)
                     for name, starts, gaps in zip(g.names, g.starts, g.by_model, strict=True)
                     for i, (at, gap) in enumerate(zip(starts, gaps, strict=True)))
    halves: dict[str, tuple[int, IdleHistogram, IdleHistogram]] = {}
    if other_half:
        for name, starts, gaps in zip(g.names, g.starts, g.by_model, strict=True):
            half = len(gaps) // 2
            first, second = IdleHistogram(), IdleHistogram()
            for i, (at, gap) in enumerate(zip(starts, gaps, strict=True)):
                if i < half:
                    first = record_idle(first, float(gap), cfg, float(at))
                else:
                    second = record_idle(second, float(gap), cfg, float(at))
            halves[name] = (half, second, first)  # the first half is judged on the second
    histograms: dict[str, IdleHistogram] = {}
    pools = IdlePools()
    # (end, start, length, model). The wait for each model's first request, from the
    # trace's start, is its first interval, as the controller and the simulator count it.
    ended: list[tuple[float, float, float, str]] = [(first, 0.0, first, name)
                                                    for name, first in zip(g.names, g.first_arrivals, strict=True)
                                                    if first > 0]
    heapq.heapify(ended)
    idle, cold = 0.0, g.models
    for at, gap, name, i in periods:
        while ended and ended[0][0] <= at:
            _, began, length, whose = heapq.heappop(ended)
            histograms[whose] = record_idle(histograms.get(whose, IdleHistogram()), length, cfg, began)
        pools = pooled(pools, {m: (key, h) for m, h in histograms.items()}, at)
        own = histograms.get(name, IdleHistogram())
        if other_half:
            half, for_first, for_second = halves[name]
            judged_on = for_first if i < half else for_second
        else:
            judged_on = own
        w = keep_alive_window(judged_on, autoscaling, pools.prior(name, key), idle_since=at)
        held_s, cold_start = window_outcome(w, np.array([gap]))
        held, missed = float(held_s[0]), bool(cold_start[0])
        idle += held
        cold += missed
        if by_class is not None:
            row = by_class.setdefault(own_class(own.total()), [0, 0.0, 0])
            row[0] += 1
            row[1] += held
            row[2] += missed
        heapq.heappush(ended, (at + gap, at, gap, name))
    return idle, cold


def at_budget(points: list[tuple[float, int]], budget_s: float) -> float | None:
    """Cold starts at ``budget_s`` of idle time, interpolated between the points either
    side; None outside them."""
    pts = sorted(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= budget_s <= x1:
            return float(y0 if x1 == x0 else y0 + (y1 - y0) * (budget_s - x0) / (x1 - x0))
    return None


def run_trace(g: Gaps, prices: list[float], variants: list[tuple[str, dict[str, Any]]],
              other_half: bool = False) -> dict[str, Any]:
    budget = g.budget_where_fixed_is(2.0)
    out: dict[str, Any] = {"models": g.models, "gaps": len(g.gaps), "variants": []}
    if budget is not None:
        best = g.oracle_cold_starts(budget)
        per_model, cross_fitted = g.per_model_timeouts_cold_starts(budget), g.cross_fitted_timeouts_cold_starts(budget)
        assert per_model is not None and cross_fitted is not None  # gaps_of keeps each model's gaps
        out["budget_idle_replica_hours"] = round(budget / 3600, 3)
        out["oracle_cold_starts"] = best
        out["per_model_timeouts_vs_oracle"] = round(per_model / best, 3)
        out["cross_fitted_timeouts_vs_oracle"] = round(cross_fitted / best, 3)
    for name, overrides in variants:
        cfg = KeepAliveHistogram(**overrides)
        for history in ("own past", "other half") if other_half else ("own past",):
            out["variants"].append(_variant_row(g, prices, name, overrides, cfg, history, budget,
                                                out.get("oracle_cold_starts")))
    return out


def _variant_row(g: Gaps, prices: list[float], name: str, overrides: dict[str, Any], cfg: KeepAliveHistogram,
                 history: str, budget: float | None, oracle_at_budget: int | None) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": name, "settings": overrides, "history": history, "points": []}
    points = []
    for price in prices:
        classes: dict[str, list[float]] = {}
        idle, cold = replay(g, price, cfg, other_half=history == "other half", by_class=classes)
        points.append((idle, cold))
        row["points"].append({
            "price_s": price, "idle_replica_hours": round(idle / 3600, 3), "cold_starts": cold,
            "vs_oracle": round(cold / g.oracle_cold_starts(idle), 3),
            "by_own_intervals": {c: {"periods": int(v[0]), "idle_replica_hours": round(v[1] / 3600, 3),
                                     "cold_starts": int(v[2])} for c, v in classes.items()}})
    if budget is not None and oracle_at_budget:
        cold_at = at_budget(points, budget)
        row["vs_oracle_at_budget"] = None if cold_at is None else round(cold_at / oracle_at_budget, 3)
    return row


def report(result: dict[str, Any]) -> str:
    lines = []
    for trace, t in result["traces"].items():
        if "budget_idle_replica_hours" not in t:
            lines.append(f"{trace}: no fixed timeout has twice the oracle's cold starts")
        else:
            lines.append(f"{trace}: fixed timeouts are 2x the oracle at {t['budget_idle_replica_hours']:.0f} idle "
                         f"replica-h; per-model timeouts there: {t['per_model_timeouts_vs_oracle']:.3f} in "
                         f"hindsight, {t['cross_fitted_timeouts_vs_oracle']:.3f} cross-fitted")
        for v in t["variants"]:
            at = v.get("vs_oracle_at_budget")
            pts = " ".join(f"{p['price_s']:g}:{p['vs_oracle']:.2f}" for p in v["points"])
            label = v["variant"] if v["history"] == "own past" else f"{v['variant']} (other half)"
            lines.append(f"  {label:24s} x oracle there {'-' if at is None else f'{at:.3f}'}; by price {pts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.keepalive_replay", description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, action="append", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", type=Path, default=Path("examples/simulate.yaml"))
    p.add_argument("--model-template", default="template-8b")
    p.add_argument("--prices", default=",".join(f"{x:g}" for x in PRICES_S))
    p.add_argument("--variant", action="append", default=[],
                   help="NAME:key=value,... (keep_alive_histogram settings); default: the defaults")
    p.add_argument("--other-half", action="store_true",
                   help="also judge each model on the other half of its gaps, not its own past")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("defaults", {})]
    prices = [float(x) for x in args.prices.split(",")]
    started = time.monotonic()
    traces = {path.stem: run_trace(load_gaps(path, args.config, args.model_template), prices, variants,
                                   args.other_half) for path in args.trace}
    result = {"prices_s": prices, "traces": traces, "wall_s": round(time.monotonic() - started, 1)}
    args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
