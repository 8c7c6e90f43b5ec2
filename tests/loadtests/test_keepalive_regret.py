"""The keep-alive regret bench: its pricing by hand, and a small run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadtests import keepalive_regret as kr
from thaw.config import KeepAliveHistogram
from warm_pool.keepalive import KeepAliveWindow


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
