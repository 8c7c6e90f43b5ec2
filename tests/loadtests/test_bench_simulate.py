"""``thaw bench simulate``: both scenarios run and report their figures (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

from thaw.cli.main import main


def test_both_scenarios_report_their_rates_and_the_fidelity(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "simulate", "--models", "5", "--days", "0.05", "--baseline-hours", "0.2",
                 "--production-hours", "0.002", "--fidelity-minutes", "0.05", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    cold, prod = report["cold_heavy"], report["production"]
    assert cold["requests"] > 0 and cold["baseline"]["same_decisions"] is True
    assert prod["requests"] > 10_000 and prod["requests_per_s"] > 0 and prod["big_model"]["requests"] > 0
    fid = prod["fidelity"]
    assert fid["same_decisions"] is True and fid["requests"] > 0
    assert set(fid["ttft_fast_over_exact_minus_1"]) == {"p50", "p90", "p99"}
