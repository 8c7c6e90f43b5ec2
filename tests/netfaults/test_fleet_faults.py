"""Thaw as a fleet across hosts (loadtests/netfaults/fleet.py: PostgreSQL, Redis, the
store, two controllers, two activators, two workers with real vLLM on the CPU and
moto's EC2, each on its own address), under streamed load through both activators, through the short
fault schedule: the leader cut from PostgreSQL, the leader paused for three leases, an
activator cut from the controllers. Each fault is healed and the fleet must be whole
again; the history checker then proves that no request was lost or metered twice, no
worker held two assignments, and no deposed term acted. The full schedule, with its
figures, is `thaw bench netfaults` (docs/RELIABILITY.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.netfaults import schedule
from loadtests.netfaults.checker import check
from loadtests.netfaults.fleet import FleetOptions, NetFleet
from loadtests.netfaults.net import unavailable

pytestmark = [pytest.mark.integration, pytest.mark.engine,
              pytest.mark.skipif(unavailable() is not None, reason=f"netfaults: {unavailable()}")]


def test_the_fleet_across_hosts_loses_nothing_through_the_short_schedule(demo_model_dir: Path,
                                                                        tmp_path: Path) -> None:
    fleet = NetFleet(tmp_path / "fleet", demo_model_dir, FleetOptions())
    try:
        with fleet.inside():
            fleet.start()
            run = schedule.run(fleet, schedule.SHORT, tmp_path / "sent.jsonl")
    finally:
        fleet.close()
    schedule.finish(fleet, run)
    report = check(run.history, run.end_at)
    print(report.table())  # the checker's table, in the test's output
    assert report.ok, report
    assert not run.notes, run.notes  # whole again after every fault
    rows = {r.fault: r for r in report.rows}
    assert rows["leader cut from postgres"].takeover_s is not None  # the other took over
    assert rows["leader paused (SIGSTOP)"].takeover_s is not None
    assert all(r.requests > 0 and r.whole_after_s is not None for r in report.rows), report.table()
    # The history was read, not empty: terms, worker calls, and the EC2 pool's instances
    # (launched and terminated all along: its instances never boot).
    assert len(run.history.terms) >= 3 and run.history.accepted and run.history.instances
