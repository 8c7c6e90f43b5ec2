"""The keep-alive replay bench: the learned policy on a trace's idle periods, priced as
the oracle prices a policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from loadtests import keepalive_replay as kp
from simulator.oracle import Gaps, gaps_of
from simulator.run import prepare
from simulator.traces import read_trace
from thaw.config import KeepAliveHistogram, parse_config


def _gaps(periods: dict[str, list[tuple[float, float]]], firsts: dict[str, float] | None = None) -> Gaps:
    """Each model's idle periods (start, length); its first request at 0 unless
    ``firsts`` says otherwise."""
    names = tuple(periods)
    by_model = tuple(np.array([g for _, g in periods[n]]) for n in names)
    starts = tuple(np.array([at for at, _ in periods[n]]) for n in names)
    first = tuple((firsts or {}).get(n, 0.0) for n in names)
    return Gaps(len(names), np.sort(np.concatenate(by_model)), 1.0, by_model, starts, names, first)


def test_a_busy_model_is_held_and_a_sparse_one_let_go_once_their_gaps_show_it() -> None:
    # "busy": 100 s gaps; "sparse": 5,000 s gaps, from 50,000 s on. Without the pooled
    # prior, each model's first period has nothing to learn from: the fixed 300 s (busy's
    # gap kept, sparse's held 300 s and cold). Then busy's own gaps say hold (within
    # trust's bounds, at least 0.7 x 300 s: every gap kept) and sparse's say let go at
    # once (no idle time, cold).
    busy = [(200.0 * i, 100.0) for i in range(6)]
    sparse = [(50_000.0 + 6000.0 * i, 5000.0) for i in range(4)]
    g = _gaps({"busy": busy, "sparse": sparse})
    idle, cold = kp.replay(g, 300.0, KeepAliveHistogram(prior_samples=0, prior_floor=0))
    assert cold == 2 + 4  # each model's first request, and every sparse gap
    assert idle == pytest.approx(6 * 100.0 + 300.0)
    # A first request 49,000 s into the trace: that wait is sparse's first interval (as
    # the controller counts it), out of range. Its first period is not held from the
    # start: let go, and a replica back for 60 s from 240 s (every choice costs a cold
    # start on a gap past the range; this one is found first), then cold.
    waited = _gaps({"busy": busy, "sparse": sparse}, firsts={"sparse": 49_000.0})
    assert kp.replay(waited, 300.0, KeepAliveHistogram(prior_samples=0, prior_floor=0)) == (6 * 100.0 + 60.0, 6)
    # With it, busy's short gaps are sparse's prior, counted as 10 less its own: its
    # first four are held to the first bin edge past 210 s, then cold.
    idle, cold = kp.replay(g, 300.0, KeepAliveHistogram())
    assert cold == 2 + 4 and idle == pytest.approx(6 * 100.0 + 4 * 240.0)


def test_judged_on_the_other_half_of_its_gaps_a_model_sees_its_traffic_change_coming() -> None:
    # Gaps of 100, 100, then 5,000 s twice; the histogram alone (no prior, no
    # smoothing, no bounds, no pre-warm) at a price of 300 s.
    g = _gaps({"m": [(0.0, 100.0), (200.0, 100.0), (10_000.0, 5000.0), (20_000.0, 5000.0)]})
    cfg = KeepAliveHistogram(prior_samples=0, prior_floor=0, smoothing=0, trust=0, prewarm=False)
    # Its own past: the first period has nothing to learn from (the fixed 300 s: kept),
    # the next three hold to 120 s (100 s gaps so far): the two 5,000 s gaps are cold.
    classes: dict[str, list[float]] = {}
    assert kp.replay(g, 300.0, cfg, by_class=classes) == (100.0 + 100.0 + 120.0 + 120.0, 1 + 2)
    assert classes == {"0-2": [3, 320.0, 1], "3-9": [1, 120.0, 1]}
    # The other half: the 100 s gaps are judged on the 5,000 s ones (let go: both cold),
    # the 5,000 s gaps on the 100 s ones (held 120 s each, cold).
    assert kp.replay(g, 300.0, cfg, other_half=True) == (240.0, 1 + 4)


def test_the_budget_reading_interpolates_between_the_prices_either_side() -> None:
    points = [(100.0, 50), (300.0, 10), (200.0, 30)]
    assert kp.at_budget(points, 250.0) == pytest.approx(20.0)
    assert kp.at_budget(points, 100.0) == pytest.approx(50.0)
    assert kp.at_budget(points, 99.0) is None and kp.at_budget(points, 301.0) is None


def test_a_run_reports_each_price_and_the_yardsticks_at_the_2x_budget(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = []
    for k in range(12):  # models of falling traffic: their gaps from a minute to hours
        rows += [(t, f"m{k}") for t in np.cumsum(rng.exponential(60.0 * 2 ** k, 400)) if t < 86_400]
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,model,tenant,input_tokens,output_tokens\n"
                     + "".join(f"{t:.3f},{m},default,100,10\n" for t, m in sorted(rows)))
    out = tmp_path / "replay.json"
    assert kp.main(["--trace", str(trace), "--out", str(out), "--prices", "60,300,1800", "--other-half",
                    "--variant", "defaults:", "--variant", "fixed:trust=1"]) == 0
    t = json.loads(out.read_text())["traces"]["t"]
    assert t["models"] == len({m for _, m in rows}) and t["budget_idle_replica_hours"] > 0
    assert 1 <= t["per_model_timeouts_vs_oracle"] <= 2 and 1 <= t["cross_fitted_timeouts_vs_oracle"]
    assert [(v["variant"], v["history"]) for v in t["variants"]] == [
        ("defaults", "own past"), ("defaults", "other half"), ("fixed", "own past"), ("fixed", "other half")]
    for v in t["variants"]:
        assert [p["price_s"] for p in v["points"]] == [60, 300, 1800]
        assert all(p["vs_oracle"] >= 1 for p in v["points"])
        for p in v["points"]:  # every period in one class of its model's own intervals
            classes = p["by_own_intervals"].values()
            assert sum(c["periods"] for c in classes) == t["gaps"]
            assert sum(c["cold_starts"] for c in classes) + t["models"] == p["cold_starts"]
    # trust 1 is the fixed timeout (and so is a window with nothing to learn from): its
    # points are the oracle's fixed timeouts.
    inputs = prepare(parse_config(yaml.safe_load(Path("examples/simulate.yaml").read_text())), read_trace(trace),
                     template="template-8b")
    g = gaps_of(inputs.trace, inputs.costs)
    for p, price in zip(t["variants"][2]["points"], (60.0, 300.0, 1800.0), strict=True):
        idle, cold = g.fixed_timeout(price)
        assert (p["idle_replica_hours"], p["cold_starts"]) == (round(idle / 3600, 3), cold)
