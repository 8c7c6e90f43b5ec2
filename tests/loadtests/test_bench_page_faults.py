"""`thaw bench page-faults`: the figures it writes, and the fault counts that explain them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadtests import bench_page_faults
from thaw.units import MiB


def test_it_counts_the_faults_each_kind_of_memory_takes(tmp_path: Path) -> None:
    out = tmp_path / "pf.json"
    args = argparse.Namespace(out=out, size=32 * MiB, reps=1)
    assert bench_page_faults.run(args) == 0
    r = json.loads(out.read_text())
    pages = 32 * MiB // 4096
    faults = {m: r["medians"][m]["faults"] for m in bench_page_faults.METHODS}
    # Fresh and populated memory fault every 4 KiB page (populate before the writes);
    # memory faulted in beforehand takes almost none during the run.
    assert faults["fresh"] >= pages * 0.9
    assert faults["populate"] >= pages * 0.9
    assert faults["reused"] < pages * 0.05
    assert set(r["wall_vs_fresh"]) == set(bench_page_faults.METHODS) and r["wall_vs_fresh"]["fresh"] == 1.0
    assert r["bytes"] == 32 * MiB and len(r["reps"]["fresh"]) == 1
    assert set(r["transparent_hugepage"]) == {"enabled", "defrag"}
