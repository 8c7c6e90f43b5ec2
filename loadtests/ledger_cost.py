"""What a durable usage record costs: the ledger against the fsync beneath it.

    python -m loadtests.ledger_cost [--records 2000] [--out FILE.json]

In a directory on the disk the ledger would use (``--dir``, default a temporary one),
each of these writes ``--records`` records, one durable commit at a time unless said,
and reports CPU microseconds per record (the writing thread's, and for the ledger the
event loop's too) and wall microseconds:

- ``append_fdatasync``: a JSON line appended to a file and ``fdatasync``-ed, the least
  any durable log does per commit;
- ``sqlite_commit``: the ledger's own statement on its own connection (WAL,
  ``synchronous=FULL``), one transaction per record; ``sqlite_batch_N``: N per transaction;
- ``ledger_sequential``: :class:`activator.ledger.Ledger` from an event loop, each
  ``append`` awaited before the next (a quiet activator: one commit per request);
- ``ledger_4_at_a_time``: four appends in flight, as records meet in a busy one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from activator.ledger import _COLUMNS, _INSERT, Ledger, UsageRecord
from loadtests.procs import cpu_split

RECORD = UsageRecord(request_id="r", tenant="t", model="m", status=200, error_code=None, prompt_tokens=10,
                     completion_tokens=32, cached_tokens=0, usage_source="engine", queue_ms=0.1, ttft_ms=1.0,
                     duration_ms=2.0, cold_start=False, cancelled=False, stream=True, replica="r1",
                     started_at=1.0, finished_at=2.0)


def _per_record(n: int, cpu_s: float, wall_s: float, **more: float) -> dict[str, float]:
    return {"cpu_us": cpu_s / n * 1e6, "wall_us": wall_s / n * 1e6, **{k: v / n * 1e6 for k, v in more.items()}}


def append_fdatasync(d: Path, n: int) -> dict[str, float]:
    fd = os.open(d / "log.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    line = (json.dumps([getattr(RECORD, c) for c in _COLUMNS]) + "\n").encode()
    try:
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(n):
            os.write(fd, line)
            os.fdatasync(fd)
        return _per_record(n, time.thread_time() - c0, time.perf_counter() - w0)
    finally:
        os.close(fd)


def sqlite_commits(d: Path, n: int, batch: int) -> dict[str, float]:
    conn = Ledger.connect(d / f"batch{batch}.db")
    row = [getattr(RECORD, c) for c in _COLUMNS]
    try:
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(n // batch):
            conn.execute("BEGIN")
            conn.executemany(_INSERT, [row] * batch)
            conn.execute("COMMIT")
        return _per_record(n // batch * batch, time.thread_time() - c0, time.perf_counter() - w0)
    finally:
        conn.close()


async def ledger_appends(d: Path, n: int, in_flight: int) -> dict[str, float]:
    """The ledger from an event loop on this process's main thread (``asyncio.run``, as
    :func:`main` runs it): that thread's CPU is the loop's, the rest the writer's."""
    ledger = Ledger(d / f"ledger{in_flight}.db")
    try:
        cpu0, w0 = cpu_split([os.getpid()]), time.perf_counter()
        for _ in range(n // in_flight):
            await asyncio.gather(*(ledger.append(RECORD) for _ in range(in_flight)))
        cpu, wall = cpu_split([os.getpid()], since=cpu0), time.perf_counter() - w0
        done = n // in_flight * in_flight
        return _per_record(done, cpu["total_s"], wall, event_loop_cpu_us=cpu["main_thread_s"],
                           writer_cpu_us=cpu["other_threads_s"])
    finally:
        ledger.close()


def measure(d: Path, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"append_fdatasync": append_fdatasync(d, n), "sqlite_commit": sqlite_commits(d, n, 1)}
    for batch in (4, 16):
        out[f"sqlite_batch_{batch}"] = sqlite_commits(d, n, batch)
    out["ledger_sequential"] = asyncio.run(ledger_appends(d, n, 1))
    out["ledger_4_at_a_time"] = asyncio.run(ledger_appends(d, n, 4))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="thaw-ledger-cost-") as tmp:
        report = {"records": args.records, "results": measure(Path(tmp), args.records)}
    for name, r in report["results"].items():
        print(f"{name:20s} cpu {r['cpu_us']:6.1f} us/record, wall {r['wall_us']:6.1f} us/record")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
