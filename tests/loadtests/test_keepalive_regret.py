"""The keep-alive regret bench: its pricing by hand, and a small run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadtests import keepalive_regret as kr
from thaw.config import KeepAliveHistogram
from warm_pool.policy.keepalive import IdleHistogram, KeepAliveWindow, record_idle


def test_a_window_is_priced_as_idle_seconds_plus_the_price_per_cold_start() -> None:
    hold = KeepAliveWindow("histogram", "", None, 100.0)
    # 50 s kept whole; 150 s kept 100 s, then cold.
    assert kr.window_cost(hold, np.array([50.0, 150.0]), 1000.0) == pytest.approx((50 + 100) / 2 + 1000 / 2)
    prewarm = KeepAliveWindow("histogram", "", 100.0, 200.0)
    # 50 s: before the pre-warm, cold, nothing held; 150 s: held from 100 s, warm;
    # 300 s: held 100-200 s, then cold.
    assert kr.window_cost(prewarm, np.array([50.0, 150.0, 300.0]), 1000.0) == pytest.approx(
        (0 + 50 + 100) / 3 + 1000 * 2 / 3)


def test_a_clock_is_learnt_from_a_few_gaps_and_a_bad_variant_is_refused() -> None:
    cfg = KeepAliveHistogram()
    assert kr.regret(kr.DISTRIBUTIONS["clock 630 s"], 950.0, [10], 3, cfg)[0] == pytest.approx(0.0, abs=0.01)
    assert kr.parse_variant("n^-0.2:smoothing_exponent=0.2") == ("n^-0.2", {"smoothing_exponent": 0.2})
    assert kr.parse_variant("no pre-warm:prewarm=false,trust=0") == ("no pre-warm", {"prewarm": "false", "trust": 0.0})
    with pytest.raises(ValueError):
        kr.parse_variant("typo:smoothing_exponant=0.2")
    with pytest.raises(ValueError):
        kr.parse_variant("bad:trust=2")


def test_a_small_run_writes_every_distribution_per_variant_and_price(tmp_path: Path) -> None:
    out = tmp_path / "regret.json"
    assert kr.main(["--out", str(out), "--prices", "950", "--intervals", "3,10", "--seeds", "2"]) == 0
    result = json.loads(out.read_text())
    assert [r["variant"] for r in result["rows"]] == ["defaults", "raw counts"]
    for row in result["rows"]:
        assert set(row["regret"]) == set(kr.DISTRIBUTIONS) and all(len(v) == 2 for v in row["regret"].values())
        assert row["mean_regret"] == pytest.approx(np.mean([x for v in row["regret"].values() for x in v]))


def test_gaps_are_counted_as_record_idle_counts_them_one_by_one() -> None:
    cfg = KeepAliveHistogram()
    gaps = np.random.default_rng(1).lognormal(6.0, 2.0, 2000)
    one_by_one = IdleHistogram()
    for g in gaps:
        one_by_one = record_idle(one_by_one, float(g), cfg)
    at_once = kr.histogram(gaps, cfg)
    assert at_once.counts == one_by_one.counts and at_once.out_of_range == one_by_one.out_of_range
    assert at_once.out_of_range_s == pytest.approx(one_by_one.out_of_range_s)


def _write_trace(path: Path) -> None:
    """A model on a clock (a 1 s request every 630 s), one whose gaps are random, and
    one with too few requests to be judged (but pooled)."""
    rng = np.random.default_rng(3)
    rows = [(630.0 * i, "clock") for i in range(80)]
    rows += [(t, "random") for t in np.cumsum(rng.exponential(900.0, 80))]
    rows += [(5000.0 * i, "sparse") for i in range(5)]
    lines = ["timestamp,model,tenant,input_tokens,output_tokens"]
    lines += [f"{t:.3f},{m},default,100,10" for t, m in sorted(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_a_traces_models_are_judged_on_their_own_gaps(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    _write_trace(trace)
    models = kr.trace_gaps(trace, Path("examples/simulate.yaml"), "template-8b")
    assert set(models) == {"clock", "random", "sparse"} and len(models["sparse"]) == 4
    # The clock's gaps: 630 s less each request's serving time.
    assert np.ptp(models["clock"]) < 1e-6 and 620 < models["clock"][0] < 630
    per = kr.trace_costs(models, 950.0, [3, 10, 60], 4, KeepAliveHistogram(trust=0), with_prior=True, min_gaps=20)
    assert set(per) == {"clock", "random"}  # sparse: pooled, not judged
    # Ten gaps of a clock show it: a pre-warm just before each request, as the best
    # window knowing every gap has.
    clock = per["clock"]
    assert clock["gaps"] == 79 and clock["cost"][1] == pytest.approx(clock["reference"])
    assert per["random"]["cost"][2] is None  # 79 gaps: under 2 x 60
    assert all(c >= per["random"]["reference"] * 0.95 for c in per["random"]["cost"][:2])
    # The reference is the same for every variant: trust's bounds (no pre-warm before
    # 0.7 x 950 s) hold the replica across each ~625 s gap, six times the best's cost.
    bounded = kr.trace_costs(models, 950.0, [10], 4, KeepAliveHistogram(), with_prior=True, min_gaps=20)
    assert bounded["clock"]["cost"][0] > 6 * clock["reference"]
    # The fleet's regret weighs each model by its cost per gap.
    both = {"a": {"reference": 1.0, "cost": [2.0, None]}, "b": {"reference": 9.0, "cost": [9.0, None]}}
    assert kr.fleet_regret(both, 0) == pytest.approx(11 / 10 - 1) and kr.fleet_regret(both, 1) is None


def test_a_run_on_a_trace_reports_each_model_and_the_trace_mean(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    _write_trace(trace)
    out = tmp_path / "regret.json"
    assert kr.main(["--out", str(out), "--trace", str(trace), "--prior", "--prices", "950",
                    "--intervals", "3,10", "--seeds", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["prior"] is True
    for row in result["rows"]:
        assert set(row["regret"]) == {"t"} and row["models"] == {"t": [2, 2]}
        per_model = row["per_model"]["t"]
        assert row["regret"]["t"] == pytest.approx([
            sum(m["cost"][i] for m in per_model.values()) / sum(m["reference"] for m in per_model.values()) - 1
            for i in range(2)])


def test_prior_without_a_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        kr.main(["--out", str(tmp_path / "x.json"), "--prior"])
