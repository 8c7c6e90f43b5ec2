"""`python -m loadtests.ledger_cost`: every way of writing a record is measured, and each wrote them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from loadtests import ledger_cost


def test_a_short_run_measures_every_way_and_writes_every_record(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    assert ledger_cost.main(["--records", "32", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"append_fdatasync", "sqlite_commit", "sqlite_batch_4", "sqlite_batch_16",
                                      "ledger_sequential", "ledger_4_at_a_time"}
    for name, r in report["results"].items():
        # (Per-thread CPU comes in clock ticks: 32 records may fall within one.)
        assert r["cpu_us"] >= 0 and r["wall_us"] > 0, name
    ledger = report["results"]["ledger_sequential"]
    assert abs(ledger["event_loop_cpu_us"] + ledger["writer_cpu_us"] - ledger["cpu_us"]) < 1e-6


def test_the_ledger_ways_commit_every_record(tmp_path: Path) -> None:
    import asyncio

    asyncio.run(ledger_cost.ledger_appends(tmp_path, 12, 4))
    assert sqlite3.connect(tmp_path / "ledger4.db").execute("SELECT COUNT(*) FROM usage").fetchone() == (12,)
    ledger_cost.sqlite_commits(tmp_path, 12, 4)
    assert sqlite3.connect(tmp_path / "batch4.db").execute("SELECT COUNT(*) FROM usage").fetchone() == (12,)
