"""``thaw bench simulate``: both scenarios run and report their figures (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

from simulator import generate
from simulator.traces import write_generic
from thaw.cli.main import main
from thaw.config import load_config


def test_both_scenarios_report_their_rates_and_the_fidelity(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    busy = tmp_path / "busy.csv"
    write_generic(generate.diurnal(2, 600, rate_per_hour=20_000, sigma=0.5, seed=3), busy)
    assert main(["bench", "simulate", "--models", "5", "--days", "0.05", "--baseline-hours", "0.2",
                 "--production-hours", "0.002", "--fidelity-minutes", "0.05", "--out", str(out),
                 "--fidelity-traces", str(busy), "--fidelity-trace-hours", "0.1"]) == 0
    report = json.loads(out.read_text())
    cold, prod = report["cold_heavy"], report["production"]
    assert cold["requests"] > 0 and cold["baseline"]["same_decisions"] is True
    assert prod["requests"] > 10_000 and prod["requests_per_s"] > 0 and prod["big_model"]["requests"] > 0
    fid = prod["fidelity"]
    assert fid["same_launches_releases_assignments"] is True and fid["requests"] > 0
    assert set(fid["ttft_fast_over_exact_minus_1"]) == {"p50", "p90", "p99"}
    [row] = report["fidelity_traces"]
    assert row["trace"] == "busy.csv" and row["requests"] > 1000 and row["same_launches_releases_assignments"]
    assert all(abs(d) <= 0.02 for d in row["ttft_fast_over_exact_minus_1"].values() if d is not None)


def test_the_worked_days_two_configs_differ_only_in_the_70b_pools_budget() -> None:
    # docs/OPERATIONS.md runs both; the budget file is the other with one key added.
    examples = Path(__file__).resolve().parents[2] / "examples"
    base = load_config(examples / "simulate-production.yaml").model_dump()
    budget = load_config(examples / "simulate-production-budget.yaml").model_dump()
    assert budget["pools"][0].pop("budget_usd_per_hour") == 1100
    base["pools"][0].pop("budget_usd_per_hour")
    assert budget == base
