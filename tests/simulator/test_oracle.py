"""The keep-alive oracle on traces small enough to work out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.oracle import (
    Gaps,
    cross_fitted_frontier,
    distance,
    gaps_of,
    idle_gaps,
    oracle_report,
    previous_gap_classes,
)
from tests.simulator.support import cli_args, config


def test_gaps_are_between_merged_busy_intervals() -> None:
    # Busy [0, 10), [5, 12) (overlapping: one interval [0, 12)), [20, 21), [100, 130).
    assert idle_gaps([100.0, 0.0, 5.0, 20.0], [30.0, 10.0, 7.0, 1.0]) == [8.0, 79.0]
    # Back to back: no gap; one request: none.
    assert idle_gaps([0.0, 10.0], [10.0, 1.0]) == []
    assert idle_gaps([3.0], [1.0]) == []


# Two models: a with gaps 8 and 79, b with gaps 30, 200 and 1000. First requests: 2 cold
# starts that no policy avoids.
HAND = Gaps(models=2, gaps=np.array([8.0, 30.0, 79.0, 200.0, 1000.0]), busy_s=50.0,
            by_model=(np.array([79.0, 8.0]), np.array([30.0, 200.0, 1000.0])))


def test_the_oracle_keeps_the_shortest_gaps_that_fit_the_budget() -> None:
    assert HAND.oracle_cold_starts(0) == 7  # nothing kept: 2 first requests + 5 gaps
    assert HAND.oracle_cold_starts(7.9) == 7
    assert HAND.oracle_cold_starts(8) == 6  # the 8 s gap
    assert HAND.oracle_cold_starts(38) == 5  # 8 + 30
    assert HAND.oracle_cold_starts(116) == 5
    assert HAND.oracle_cold_starts(117) == 4  # 8 + 30 + 79 (not the 200 s gap alone)
    assert HAND.oracle_cold_starts(1317) == 2  # every gap: only the first requests
    assert HAND.oracle_cold_starts(10**9) == 2
    # The inverse: the least idle time for a number of cold starts.
    assert [HAND.oracle_idle_s(n) for n in (7, 6, 5, 4, 3, 2)] == [0.0, 8.0, 38.0, 117.0, 317.0, 1317.0]
    assert HAND.oracle_idle_s(1) == float("inf")


def test_a_fixed_timeout_pays_its_timeout_in_every_gap_it_does_not_bridge() -> None:
    # 60 s: keeps 8 and 30 (38 s), pays 60 s in each of 79, 200, 1000 (180 s): 218 s idle,
    # cold starts 2 + 3.
    assert HAND.fixed_timeout(60) == (218.0, 5)
    assert HAND.fixed_timeout(0) == (0.0, 7)
    assert HAND.fixed_timeout(1000) == (1317.0, 2)
    # At 218 s of idle time the oracle keeps 8 + 30 + 79 = 117 (200 more does not fit):
    # 4 cold starts, one fewer than the timeout's 5.
    d = distance(HAND, *HAND.fixed_timeout(60))
    assert (d["oracle_cold_starts"], d["extra_cold_starts"], d["vs_oracle"]) == (4, 1, 1.25)


@pytest.mark.parametrize("timeout", [0.0, 5.0, 8.0, 30.0, 60.0, 79.0, 150.0, 200.0, 999.0, 1000.0, 5000.0])
def test_no_fixed_timeout_beats_the_oracle(timeout: float) -> None:
    idle, cold = HAND.fixed_timeout(timeout)
    assert cold >= HAND.oracle_cold_starts(idle)


def test_per_model_timeouts_chosen_in_hindsight() -> None:
    # a's options (timeout: idle, cold starts of its gaps): 0: (0, 2); 8 s: (8 + 8, 1);
    # 79 s: (87, 0). b's: 0: (0, 3); 30 s: (30 + 2 x 30, 2); 200 s: (230 + 200, 1);
    # 1000 s: (1230, 0). Merged by idle seconds per cold start saved (16, 71, 90, 340,
    # 800), from 7 cold starts at no idle time:
    xs, ys = HAND._per_model_frontier
    assert xs.tolist() == [0.0, 16.0, 87.0, 177.0, 517.0, 1317.0] and ys.tolist() == [7, 6, 5, 4, 3, 2]
    assert HAND.per_model_timeouts_cold_starts(177.0) == 4
    # Between vertices, the last one that fits: fixed 60 s's 218 s of idle time.
    assert HAND.per_model_timeouts_cold_starts(218.0) == 4
    assert HAND.per_model_timeouts_cold_starts(176.9) == 5
    # Never fewer than the oracle's, never more than the one timeout for all.
    for t in (0.0, 8.0, 30.0, 60.0, 79.0, 200.0, 1000.0):
        idle, cold = HAND.fixed_timeout(t)
        assert HAND.oracle_cold_starts(idle) <= HAND.per_model_timeouts_cold_starts(idle) <= cold
    # A model's option that no budget would pick (off its lower hull) is skipped: gaps of
    # 10, 11 and 100 s; a timeout of 10 s costs 30 s for one, 11 s costs 32 s for two.
    one = Gaps(models=1, gaps=np.array([10.0, 11.0, 100.0]), busy_s=1.0, by_model=(np.array([10.0, 11.0, 100.0]),))
    xs, ys = one._per_model_frontier
    assert xs.tolist() == [0.0, 32.0, 121.0] and ys.tolist() == [4, 2, 1]
    # Gaps without the models': no answer.
    assert Gaps(models=1, gaps=np.array([5.0]), busy_s=1.0).per_model_timeouts_cold_starts(5.0) is None


def test_per_model_timeouts_each_half_judged_with_the_other_halfs_choice() -> None:
    # One model's gaps in time order: 10, 10, then 100, 100. The first half chooses
    # 10 s at a price over 10 s (20 s of idle time against 2 x price), and the second
    # half is judged with it: 10 s held in each 100 s gap, both cold. The second half
    # chooses 100 s at a price over 100 s, and the first half's gaps are kept with it.
    g4 = np.array([10.0, 10.0, 100.0, 100.0])
    g = Gaps(models=1, gaps=np.sort(g4), busy_s=1.0, by_model=(g4,))
    xs, ys = cross_fitted_frontier(g.by_model, 5, prices=(5.0, 50.0, 500.0))
    assert xs.tolist() == [0.0, 0.0, 20.0, 40.0] and ys.tolist() == [5, 5, 5, 3]
    # At a price between 10 and 100 s the first half's choice holds 20 s in the second
    # half for no cold start saved: the traffic changed between the halves. At 40 s
    # both halves' choices save two, as the timeout of 10 s chosen in hindsight does.
    assert g.cross_fitted_timeouts_cold_starts(39.0) == 5 and g.per_model_timeouts_cold_starts(39.0) == 5
    assert g.cross_fitted_timeouts_cold_starts(40.0) == 3 == g.per_model_timeouts_cold_starts(40.0)
    # A half with no gap gets the blind policy's timeout: the price itself. One gap of
    # 50 s is kept at prices of 50 s and more, held for the price and cold below it.
    one = [np.array([50.0])]
    xs, ys = cross_fitted_frontier(one, 2, prices=(20.0, 50.0))
    assert xs.tolist() == [0.0, 20.0, 50.0] and ys.tolist() == [2, 2, 1]
    # Never better than the oracle.
    for idle in (0.0, 20.0, 40.0, 400.0):
        assert g.cross_fitted_timeouts_cold_starts(idle) >= g.oracle_cold_starts(idle)  # type: ignore[operator]
    assert Gaps(models=1, gaps=np.array([5.0]), busy_s=1.0).cross_fitted_timeouts_cold_starts(5.0) is None


def test_a_timeout_per_class_of_the_gap_before_in_hindsight_and_its_shuffled_control() -> None:
    # Classes: the first gap; then the octave (from a minute) of the gap before.
    classes = previous_gap_classes(np.array([10.0, 1000.0, 10.0, 59.9, 60.0, 20_000.0, 5.0]))
    assert classes.tolist() == [0, 1, 6, 1, 1, 2, 10]
    # One model whose gaps alternate 10 s and 1000 s: a short gap always follows a long
    # one. One timeout for the model keeps the 10 s gaps only at 10 s a gap in the long
    # ones too (60 s for 3); by the gap before, the 10 s gaps (after 1000 s, and the
    # first) are kept for 30 s and the 1000 s ones (after 10 s) let go at once: the
    # oracle's 4 cold starts at 30 s, where one timeout has 7.
    alt = np.array([10.0, 1000.0] * 3)
    g = Gaps(models=1, gaps=np.sort(alt), busy_s=1.0, by_model=(alt,))
    assert g.oracle_cold_starts(30.0) == 4 and g.per_model_timeouts_cold_starts(30.0) == 7
    by_previous, shuffled = g.by_previous_gap_cold_starts(30.0)  # type: ignore[misc]
    assert by_previous == 4
    # The control: the same class sizes, labels shuffled (seeded, so the same each run);
    # never better than the oracle.
    assert g.by_previous_gap_cold_starts(30.0) == (by_previous, shuffled) and shuffled >= 4
    # Where every gap is alike the gap before says nothing, and the control shows it:
    # any split lowers a hindsight frontier (here the first gap alone is kept for 100 s,
    # 6 cold starts where one timeout for all has 7), and the shuffled split by as much.
    same = np.full(6, 100.0)
    flat = Gaps(models=1, gaps=same, busy_s=1.0, by_model=(same,))
    assert flat.by_previous_gap_cold_starts(100.0) == (6, 6) and flat.per_model_timeouts_cold_starts(100.0) == 7
    for idle in (0.0, 300.0, 600.0):
        by_prev, control = flat.by_previous_gap_cold_starts(idle)  # type: ignore[misc]
        assert by_prev == control <= flat.per_model_timeouts_cold_starts(idle)  # type: ignore[operator]
    assert Gaps(models=1, gaps=np.array([5.0]), busy_s=1.0).by_previous_gap_cold_starts(5.0) is None


def test_gaps_of_a_trace_use_the_cost_models_serving_times(tmp_path: Path) -> None:
    from simulator.costs import CostModel, ModelCosts
    from simulator.traces import from_columns

    c = ModelCosts(weights_gib=1, standby_load_s=10, asleep_load_s=1, release_s=0, prefill_tokens_per_s=100,
                   tpot_s=0.5, source="test")
    # m0: requests at 0 and 100, each 1 s of prefill (100 tokens) + 2 s of output (4 x 0.5):
    # busy [0, 3) and [100, 103), one gap of 97 s. m1: one request: no gap.
    trace = from_columns([0.0, 100.0, 50.0], [0, 0, 1], [0, 0, 0], [100, 100, 100], [4, 4, 4],
                         ["m0", "m1"], ["t"], "test")
    g = gaps_of(trace, CostModel({"m0": c, "m1": c}))
    assert (g.models, g.gaps.tolist(), g.busy_s) == (2, [97.0], pytest.approx(9.0))
    report = oracle_report(g, timeouts_s=(60.0, 100.0))
    assert [(r["policy"], r["cold_starts"], r["oracle_cold_starts"]) for r in report["policies"]] == [
        ("fixed 60 s", 3, 3), ("fixed 100 s", 2, 2)]


def test_the_cli_writes_the_oracle_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    args = cli_args(tmp_path, config(1, idle_grace_s=100), [(0, "m0", 100, 4), (100, "m0", 100, 4),
                                                            (1000, "m0", 100, 4)], prefill=100, tpot_s=0.5)
    assert main([*args, "--oracle", "--out-dir", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "1 models, 2 idle gaps" in out and "fixed 300 s" in out
    doc = json.loads((tmp_path / "o" / "oracle.json").read_text())
    # Gaps 97 and 897 s. Fixed 300 s: 97 + 300 idle, 2 cold starts; the oracle at 397 s
    # keeps the 97 s gap only: 2 as well.
    row = next(r for r in doc["policies"] if r["timeout_s"] == 300.0)
    assert (row["cold_starts"], row["oracle_cold_starts"], row["extra_cold_starts"]) == (2, 2, 0)
    assert main([*args, "--oracle", "--compare-packing"]) == 2
    assert "choose one" in capsys.readouterr().err
    # With --sweep: the sweep, then the oracle's table, both written under --out.
    assert main([*args, "--sweep", "--oracle", "--budgets", "none", "--idle-grace-s", "100", "--keep-alive", "fixed",
                 "--out-dir", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "x_oracle" in out and "fixed 300 s" in out
    assert {p.name for p in (tmp_path / "s").iterdir()} >= {"sweep.json", "oracle.json", "frontier.png"}


def test_the_budget_where_a_fixed_timeout_first_has_twice_the_oracles_cold_starts() -> None:
    # Gaps of 5 s (four) and 20 s (two), one model. A fixed timeout of 3 s holds 3 s in
    # each of six gaps (18 s) for 7 cold starts, where the oracle keeps three 5 s gaps
    # (4 cold starts): 1.75x. At 4 s, 24 s for 7, against the oracle's 3: 2.33x. So
    # the fixed timeouts pass 2x between 18 and 24 s of idle time.
    g = np.array([5.0, 5.0, 5.0, 5.0, 20.0, 20.0])
    gaps = Gaps(models=1, gaps=g, busy_s=1.0, by_model=(g,))
    budget = gaps.budget_where_fixed_is(2.0)
    assert budget is not None and 18.0 < budget < 24.0
    assert gaps.fixed_timeout(3.0) == (18.0, 7) and gaps.oracle_cold_starts(18.0) == 4
    assert gaps.fixed_timeout(4.0) == (24.0, 7) and gaps.oracle_cold_starts(24.0) == 3
    # One gap: every fixed timeout has the oracle's cold starts. Never 2x.
    one = np.array([5.0])
    assert Gaps(models=1, gaps=one, busy_s=1.0, by_model=(one,)).budget_where_fixed_is(2.0) is None
