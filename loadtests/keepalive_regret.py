"""How much a model's learned keep-alive window loses for having few gaps to learn from.

    python -m loadtests.keepalive_regret --out regret.json [--prices 300,950,3600] [--seeds 40]
        [--intervals 3,10,30,90] [--variant raw:smoothing=0 --variant n^-0.2:smoothing_exponent=0.2 ...]

For each gap distribution below (named, seeded), each price and each count ``n``: draw
``n`` gaps, judge the window ``keep_alive_window`` gives on them alone (no pooled prior;
the defaults of ``keep_alive_histogram`` and ``trust``, as overridden by the variant), and
price it on 200,000 gaps of the same distribution: idle seconds held plus the price per
cold start. The reference is the window the same policy gives on 20,000 gaps counted as
they are: what it would choose knowing the distribution, within the same ``trust``
bounds. Regret: the window's cost over the reference's, less 1, averaged over the seeds.

Offline and exact: no simulator, no server. The distributions are shapes a model's gaps
take (a rate that does not change, one that bursts, a cron, a cron between bursts); the
traces say which models have which (docs/OPERATIONS.md).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from thaw.config import Autoscaling, KeepAliveHistogram
from warm_pool.keepalive import IdleHistogram, KeepAliveWindow, keep_alive_window, record_idle

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


def window_cost(w: KeepAliveWindow, gaps: np.ndarray, price: float) -> float:
    """Mean idle seconds plus ``price`` per cold start of window ``w`` over ``gaps``."""
    if w.prewarm_after_s is None:
        idle = np.minimum(gaps, w.keep_until_s)
        cold = gaps > w.keep_until_s
    else:  # let go at once; a replica from prewarm_after_s, held keep_until_s from the idle start
        r = w.prewarm_after_s
        cold = (gaps < r) | (gaps > w.keep_until_s)
        idle = np.where(gaps < r, 0.0, np.minimum(gaps, w.keep_until_s) - r)
    return float(np.mean(idle) + price * np.mean(cold))


def _window(gaps: np.ndarray, price: float, cfg: KeepAliveHistogram) -> KeepAliveWindow:
    h = IdleHistogram()
    for g in gaps:
        h = record_idle(h, float(g), cfg)
    return keep_alive_window(h, Autoscaling(keep_alive="histogram", idle_grace_s=price, keep_alive_histogram=cfg))


def regret(draw: Draw, price: float, intervals: list[int], seeds: int, cfg: KeepAliveHistogram) -> list[float]:
    """Mean regret per count of intervals (see the module's docstring)."""
    truth = draw(np.random.default_rng(10_000), 200_000)
    reference = window_cost(_window(truth[:20_000], price, cfg.model_copy(update={"smoothing": 0.0})), truth, price)
    return [float(np.mean([window_cost(_window(draw(np.random.default_rng(seed), n), price, cfg), truth, price)
                           / reference - 1 for seed in range(seeds)])) for n in intervals]


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


def run(prices: list[float], intervals: list[int], seeds: int,
        variants: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    rows = []
    for name, overrides in variants:
        cfg = KeepAliveHistogram(**overrides)
        for price in prices:
            per = {dist: regret(draw, price, intervals, seeds, cfg) for dist, draw in DISTRIBUTIONS.items()}
            mean = float(np.mean([x for v in per.values() for x in v]))
            rows.append({"variant": name, "settings": overrides, "price_s": price, "regret": per, "mean_regret": mean})
    return {"intervals": intervals, "seeds": seeds, "rows": rows}


def report(result: dict[str, Any]) -> str:
    head = " ".join(f"n={n:<5d}" for n in result["intervals"])
    lines = []
    for row in result["rows"]:
        lines.append(f"{row['variant']} at {row['price_s']:g} s: mean regret {row['mean_regret'] * 100:.1f} %")
        lines.append(f"  {'':22s} {head}")
        for dist, v in row["regret"].items():
            lines.append(f"  {dist:22s} " + " ".join(f"{x * 100:6.1f}%" for x in v))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.keepalive_regret", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prices", default="300,950,3600")
    p.add_argument("--intervals", default="3,10,30,90")
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--variant", action="append", default=[],
                   help="NAME:key=value,... (keep_alive_histogram settings); default: the defaults and raw counts")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("defaults", {}), ("raw counts", {"smoothing": 0.0})]
    started = time.monotonic()
    result = run([float(x) for x in args.prices.split(",")], [int(x) for x in args.intervals.split(",")],
                 args.seeds, variants)
    result["wall_s"] = round(time.monotonic() - started, 1)
    args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
