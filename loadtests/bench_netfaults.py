"""`thaw bench netfaults`: Thaw as a fleet across hosts under network faults, and the
history checker's verdict with the time to recover from each fault.

    thaw bench netfaults [--out bench_netfaults.json] [--schedule full|short] [--workers 2]
                         [--lease-s 3] [--heartbeat-s 2] [--store-rate 400mbit]
    (or python -m loadtests.bench_netfaults ...; needs root: network namespaces)

Starts ``loadtests.netfaults.fleet`` (PostgreSQL, Redis, the store, two controllers, two
activators, workers with real vLLM on the CPU, moto's EC2 with a pool whose instances
never boot, so launches and terminations run all along; each in its own namespace), sends
streamed chat completions through both activators, and runs the schedule
(``loadtests.netfaults.schedule``: each fault held under load, healed, and the fleet
waited on until every request completes again). Then the checker
(``loadtests.netfaults.checker``) reads the client's log, the ledgers, the terms and
provider actions in PostgreSQL and the workers' logs, and prints one line per fault:
requests, errors by kind, lost, duplicated, stale actions, the takeover (the first new
term after the fault began) and the time from healing until whole. The JSON has the
rows, the findings and the options; the exit status is 1 when the checker found
anything.

There is no baseline to run beside it: the figures are counts that must be zero and
recovery times against goals (a takeover within two heartbeat intervals of the leader
losing PostgreSQL; every other fault whole within 10 s of its healing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from loadtests.netfaults import schedule
from loadtests.netfaults.checker import check
from loadtests.netfaults.fleet import FleetOptions, NetFleet
from loadtests.netfaults.net import unavailable
from thaw.demo_model import build_demo_model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", type=Path, default=Path("bench_netfaults.json"))
    p.add_argument("--schedule", choices=("full", "short"), default="full",
                   help="full: every fault; short: the test's three (default full)")
    p.add_argument("--workers", type=int, default=2, help="workers, each on its own host (default 2)")
    p.add_argument("--lease-s", type=float, default=3.0, help="the controllers' lease (default 3)")
    p.add_argument("--heartbeat-s", type=float, default=2.0, help="workers' heartbeat interval (default 2)")
    p.add_argument("--store-rate", default=None, metavar="RATE",
                   help="limit the store host's link (tc units, e.g. 400mbit; default none)")
    p.add_argument("--keep", metavar="DIR", type=Path, default=None,
                   help="keep the run's logs and data here (default: a temporary directory, removed)")


def run(args: argparse.Namespace) -> int:
    why = unavailable()
    if why is not None:
        print(f"netfaults cannot run here: {why}")
        return 2
    root = args.keep or Path(tempfile.mkdtemp(prefix="thaw-netfaults-"))
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    if not (model / "config.json").exists():
        build_demo_model(model)
    opts = FleetOptions(workers=args.workers, lease_s=args.lease_s, heartbeat_s=args.heartbeat_s,
                        store_rate=args.store_rate)
    steps = schedule.FULL if args.schedule == "full" else schedule.SHORT
    began = time.time()
    fleet = NetFleet(root / "fleet", model, opts)
    try:
        with fleet.inside():
            fleet.start()
            r = schedule.run(fleet, steps, root / "sent.jsonl")
    finally:
        fleet.close()
    schedule.finish(fleet, r)
    report = check(r.history, r.end_at)
    print(report.table(), flush=True)
    for note in r.notes:
        print(f"note: {note}")
    out = {
        "schedule": args.schedule, "options": asdict(opts), "wall_s": round(time.time() - began, 1),
        "first_answer_s": round(r.first_answer_s, 1), "ok": report.ok, "notes": r.notes,
        "requests": len(r.history.sent), "terms": len(r.history.terms), "provider_actions": len(r.history.actions),
        "instances_launched": len(r.history.instances),
        "worker_calls_accepted": len(r.history.accepted),
        "rows": [asdict(row) for row in report.rows],
        "findings": {"lost": report.lost, "unmetered": report.unmetered, "duplicated": report.duplicated,
                     "stale": report.stale, "overlaps": report.overlaps, "double_launches": report.double_launches},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    if args.keep is None:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if report.ok and not r.notes else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    raise SystemExit(run(p.parse_args()))
