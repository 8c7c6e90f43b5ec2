"""How much a model's learned keep-alive window loses for having few gaps to learn from.

    python -m loadtests.keepalive_regret --out regret.json [--prices 300,950,3600] [--seeds 40]
        [--intervals 3,10,30,90] [--variant raw:smoothing=0 --variant n^-0.2:smoothing_exponent=0.2 ...]
        [--trace TRACE.csv ... [--config FILE] [--model-template NAME] [--min-gaps 20] [--prior]]

For each gap distribution below (named, seeded), each price and each count ``n``: draw
``n`` gaps, judge the window ``keep_alive_window`` gives on them alone (no pooled prior;
the defaults of ``keep_alive_histogram`` and ``trust``, as overridden by the variant), and
price it on 200,000 gaps of the same distribution: idle seconds held plus the price per
cold start. The reference is the window the same policy gives on 20,000 gaps counted as
they are: what it would choose knowing the distribution, within the same ``trust``
bounds. Regret: the window's cost over the reference's, less 1, averaged over the seeds.

Offline and exact: no simulator, no server. The distributions are shapes a model's gaps
take (a rate that does not change, one that bursts, a cron, a cron between bursts); the
traces say which models have which (docs/notes/keepalive-research.md).

With ``--trace`` the shapes are the traces' own: each model's idle gaps under the cost
model (``simulator.oracle.gaps_of``, as the oracle counts them), for every model with
at least ``--min-gaps``. The ``n`` gaps learnt from are a run of ``n`` consecutive ones
at a seeded start (what a model has seen: its gaps are not independent draws); the
window is priced on all of the model's gaps. The reference is the best window knowing
all of them: the one ``keep_alive_window`` gives on them counted as they are and
unbounded (``trust: 0``), the same for every variant, so trust's bounds count as regret.
A trace's regret at ``n``: its models' costs per gap summed (those with at least ``2 n``
gaps), over their references', less 1. With ``--prior`` each window also blends in the
pooled prior of the other models' whole gap sets (what the fleet has learnt by the
day's end), as the controller does.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simulator.oracle import Gaps, gaps_of
from simulator.run import prepare
from simulator.traces import read_trace
from thaw.config import Autoscaling, KeepAliveHistogram, parse_config
from warm_pool.policy.keepalive import (
    IdleHistogram,
    IdlePools,
    KeepAliveWindow,
    PooledCounts,
    keep_alive_window,
    pool_key,
    pooled,
)

Draw = Callable[[np.random.Generator, int], np.ndarray]

DISTRIBUTIONS: dict[str, Draw] = {
    # one request stream at a fixed rate: memoryless gaps
    "exponential 600 s": lambda r, n: r.exponential(600.0, n),
    "exponential 1500 s": lambda r, n: r.exponential(1500.0, n),
    "exponential 3000 s": lambda r, n: r.exponential(3000.0, n),
    # bursts: 70 % of gaps in a burst (2 min), the rest between bursts (100 min)
    "bursts": lambda r, n: np.where(r.random(n) < 0.7, r.exponential(120.0, n), r.exponential(6000.0, n)),
    # a client on a clock: every 630 s, a few seconds' jitter
    "clock 630 s": lambda r, n: r.normal(630.0, 20.0, n).clip(1.0),
    "log-normal 900 s": lambda r, n: r.lognormal(math.log(900.0), 1.2, n),
    # a cron every 25 min (jitter 100 s) with bursts between (half the gaps, mean 300 s)
    "cron between bursts": lambda r, n: np.where(r.random(n) < 0.5, r.normal(1500.0, 100.0, n),
                                                 r.exponential(300.0, n)).clip(1.0),
}


def window_outcome(w: KeepAliveWindow, gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Window ``w`` on each of ``gaps``, as the oracle prices a policy: the idle seconds
    it holds a replica, and whether the request that ends the gap is a cold start."""
    if w.prewarm_after_s is None:
        return np.minimum(gaps, w.keep_until_s), gaps > w.keep_until_s
    # Let go at once; a replica from prewarm_after_s, held to keep_until_s from the idle start.
    r = w.prewarm_after_s
    return np.where(gaps < r, 0.0, np.minimum(gaps, w.keep_until_s) - r), (gaps < r) | (gaps > w.keep_until_s)


def window_cost(w: KeepAliveWindow, gaps: np.ndarray, price: float) -> float:
    """Mean idle seconds plus ``price`` per cold start of window ``w`` over ``gaps``."""
    idle, cold = window_outcome(w, gaps)
    return float(np.mean(idle) + price * np.mean(cold))


def histogram(gaps: np.ndarray, cfg: KeepAliveHistogram) -> IdleHistogram:
    """``gaps`` counted as ``record_idle`` counts them one by one (without slots)."""
    n_bins = math.ceil(cfg.range_s / cfg.bin_s)
    inside = gaps[gaps < cfg.range_s]
    past = gaps[gaps >= cfg.range_s]
    counts = np.bincount(np.minimum(np.floor(inside / cfg.bin_s).astype(int), n_bins - 1), minlength=0)
    return IdleHistogram(tuple(int(c) for c in counts), len(past), float(past.sum()))


def _window(gaps: np.ndarray, price: float, cfg: KeepAliveHistogram,
            prior: PooledCounts | None = None) -> KeepAliveWindow:
    return keep_alive_window(histogram(gaps, cfg), Autoscaling(
        keep_alive="histogram", idle_grace_s=price, keep_alive_histogram=cfg), prior)


def regret(draw: Draw, price: float, intervals: list[int], seeds: int, cfg: KeepAliveHistogram) -> list[float]:
    """Mean regret per count of intervals (see the module's docstring)."""
    truth = draw(np.random.default_rng(10_000), 200_000)
    reference = window_cost(_window(truth[:20_000], price, cfg.model_copy(update={"smoothing": 0.0})), truth, price)
    return [float(np.mean([window_cost(_window(draw(np.random.default_rng(seed), n), price, cfg), truth, price)
                           / reference - 1 for seed in range(seeds)])) for n in intervals]


def load_gaps(path: Path, config: Path, template: str) -> Gaps:
    """The trace's idle gaps as the oracle counts them, its requests timed by the cost
    model of ``config`` with its models from ``template``."""
    inputs = prepare(parse_config(yaml.safe_load(config.read_text())), read_trace(path), template=template)
    return gaps_of(inputs.whole, inputs.costs)


def trace_gaps(path: Path, config: Path, template: str) -> dict[str, np.ndarray]:
    """Each model's idle gaps in time order, as the oracle counts them."""
    g = load_gaps(path, config, template)
    return dict(zip(g.names, g.by_model, strict=True))


def trace_costs(models: dict[str, np.ndarray], price: float, intervals: list[int], seeds: int,
                cfg: KeepAliveHistogram, with_prior: bool, min_gaps: int = 1) -> dict[str, dict[str, Any]]:
    """For every model with at least ``min_gaps`` gaps (the prior pools them all): the
    reference window's cost per gap, and the mean cost per gap of windows learnt from
    ``n`` of them, per count ``n`` (None where the model has under ``2 n``)."""
    pools = IdlePools()
    key = pool_key(cfg)
    if with_prior:
        pools = pooled(pools, {name: (key, histogram(g, cfg)) for name, g in models.items()}, 0.0)
    best = KeepAliveHistogram(smoothing=0.0, trust=0.0)
    out: dict[str, dict[str, Any]] = {}
    for name, gaps in models.items():
        if len(gaps) < max(min_gaps, 1):
            continue
        prior = pools.prior(name, key) if with_prior else None
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        costs: list[float | None] = []
        for n in intervals:
            if len(gaps) < 2 * n:
                costs.append(None)
                continue
            starts = rng.integers(0, len(gaps) - n + 1, seeds)
            costs.append(float(np.mean([window_cost(_window(gaps[s:s + n], price, cfg, prior), gaps, price)
                                        for s in starts])))
        out[name] = {"gaps": len(gaps), "reference": window_cost(_window(gaps, price, best), gaps, price),
                     "cost": costs}
    return out


def fleet_regret(per_model: dict[str, dict[str, Any]], i: int) -> float | None:
    """The models' costs per gap at the ``i``-th count summed, over their references',
    less 1 (each model weighs as its cost per idle period: a model on a clock, whose best
    window costs next to nothing, does not swamp the rest); None where no model has
    enough gaps."""
    there = [m for m in per_model.values() if m["cost"][i] is not None]
    if not there:
        return None
    return sum(m["cost"][i] for m in there) / sum(m["reference"] for m in there) - 1


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``name:key=value,key=value`` -> (name, overrides of keep_alive_histogram): a
    number where the value reads as one, else the text (``prewarm=false``)."""
    name, _, body = text.partition(":")
    overrides: dict[str, Any] = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        try:
            overrides[key] = float(value)
        except ValueError:
            overrides[key] = value
    KeepAliveHistogram(**overrides)  # a bad key or value fails here, before the run
    return name, overrides


def run(prices: list[float], intervals: list[int], seeds: int, variants: list[tuple[str, dict[str, Any]]],
        traces: dict[str, dict[str, np.ndarray]] | None = None, with_prior: bool = False,
        min_gaps: int = 1) -> dict[str, Any]:
    """Every variant at every price: regret per distribution (or per trace, its models'
    costs over their references', with each model's under ``per_model``)."""
    rows = []
    for name, overrides in variants:
        cfg = KeepAliveHistogram(**overrides)
        for price in prices:
            row: dict[str, Any] = {"variant": name, "settings": overrides, "price_s": price}
            per: dict[str, list[float | None]]
            if traces is None:
                per = {dist: list(regret(draw, price, intervals, seeds, cfg)) for dist, draw in DISTRIBUTIONS.items()}
            else:
                by_model = {t: trace_costs(models, price, intervals, seeds, cfg, with_prior, min_gaps)
                            for t, models in traces.items()}
                per = {t: [fleet_regret(m, i) for i in range(len(intervals))] for t, m in by_model.items()}
                row["per_model"] = by_model
                row["models"] = {t: [sum(v["cost"][i] is not None for v in m.values()) for i in range(len(intervals))]
                                 for t, m in by_model.items()}
            row["regret"] = per
            row["mean_regret"] = _mean([x for v in per.values() for x in v])
            rows.append(row)
    return {"intervals": intervals, "seeds": seeds, "prior": with_prior, "rows": rows}


def _mean(xs: list[float | None]) -> float | None:
    """The mean of the values that are there (None when none is)."""
    there = [x for x in xs if x is not None]
    return float(np.mean(there)) if there else None


def report(result: dict[str, Any]) -> str:
    head = " ".join(f"n={n:<5d}" for n in result["intervals"])
    lines = []
    for row in result["rows"]:
        lines.append(f"{row['variant']} at {row['price_s']:g} s: mean regret {_pct(row['mean_regret'])}")
        lines.append(f"  {'':22s} {head}")
        for dist, v in row["regret"].items():
            lines.append(f"  {dist[:22]:22s} " + " ".join(f"{_pct(x):>7s}" for x in v))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.keepalive_regret", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prices", default="300,950,3600")
    p.add_argument("--intervals", default="3,10,30,90")
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--variant", action="append", default=[],
                   help="NAME:key=value,... (keep_alive_histogram settings); default: the defaults and raw counts")
    p.add_argument("--trace", type=Path, action="append", default=[],
                   help="a trace (generic CSV, as `thaw simulate convert` writes): its models' gaps are the shapes")
    p.add_argument("--config", type=Path, default=Path("examples/simulate.yaml"),
                   help="the config whose cost model times the traces' requests (default examples/simulate.yaml)")
    p.add_argument("--model-template", default="template-8b")
    p.add_argument("--min-gaps", type=int, default=20, help="a trace's models with fewer gaps are left out")
    p.add_argument("--prior", action="store_true",
                   help="with --trace: blend in the other models' gaps pooled, as the controller does")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("defaults", {}), ("raw counts", {"smoothing": 0.0})]
    if args.prior and not args.trace:
        p.error("--prior goes with --trace")
    started = time.monotonic()
    traces = {t.stem: trace_gaps(t, args.config, args.model_template) for t in args.trace} or None
    result = run([float(x) for x in args.prices.split(",")], [int(x) for x in args.intervals.split(",")],
                 args.seeds, variants, traces, args.prior, args.min_gaps)
    result["wall_s"] = round(time.monotonic() - started, 1)
    args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
