"""The ledger: group commits, durability across SIGKILL, queries, GPU-second attribution."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from activator.ledger import Ledger, attribute_gpu_seconds, query_usage, usage_totals
from activator.usage import StreamTap, Usage, usage_from_body
from tests.activator.support import record


async def test_append_commits_and_groups(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "u.db", group_window_s=0.02)
    try:
        await asyncio.gather(*(ledger.append(record(i, "a" if i % 2 else "b")) for i in range(50)))
        # Committed: another connection sees every record right away.
        assert len(query_usage(tmp_path / "u.db")) == 50
        assert [r["request_id"] for r in query_usage(tmp_path / "u.db", tenant="a")] == [f"r{i}" for i in range(1, 50, 2)]
        assert len(query_usage(tmp_path / "u.db", since=1040.0)) == 10
        mode = sqlite3.connect(tmp_path / "u.db").execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
    finally:
        ledger.close()


async def test_records_queued_during_a_commit_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits: list[int] = []
    in_transaction = False
    connect = Ledger.connect

    def trace(sql: str) -> None:
        # A transaction ends at a COMMIT, or is one INSERT of its own (a lone record).
        nonlocal in_transaction
        if sql == "BEGIN":
            in_transaction = True
        elif sql == "COMMIT":
            in_transaction = False
            commits.append(1)
        elif sql.startswith("INSERT") and not in_transaction:
            commits.append(1)

    def counting(path: Path) -> sqlite3.Connection:
        conn = connect(path)
        conn.set_trace_callback(trace)
        return conn

    monkeypatch.setattr(Ledger, "connect", staticmethod(counting))
    ledger = Ledger(tmp_path / "u.db")  # no group window: nothing waits for company
    try:
        await asyncio.gather(*(ledger.append(record(i)) for i in range(200)))
        assert len(query_usage(tmp_path / "u.db")) == 200
        # Appended faster than one commit takes: most share a commit.
        assert 1 <= len(commits) < 50
    finally:
        ledger.close()


async def test_records_of_every_kind_are_committed_alone_or_in_a_batch(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "u.db")
    try:
        await ledger.append(record(1))  # alone: one INSERT, its own transaction
        ledger.replica_up("rep-1", "m", 1, 1000.0)
        ledger.replica_down("rep-1", 1010.0)
        await ledger.append(record(2))  # behind the two replica records, or after them
        assert [r["request_id"] for r in query_usage(tmp_path / "u.db")] == ["r1", "r2"]
        rows = sqlite3.connect(tmp_path / "u.db").execute("SELECT replica, ended_at FROM replica_intervals").fetchall()
        assert rows == [("rep-1", 1010.0)]
    finally:
        ledger.close()


def test_totals() -> None:
    rows = [record(1).__dict__, record(2, status=503, prompt_tokens=0, completion_tokens=0).__dict__,
            record(3, cancelled=True, cold_start=True).__dict__]
    assert usage_totals(rows) == {"requests": 3, "prompt_tokens": 20, "completion_tokens": 10, "cached_tokens": 0,
                                  "errors": 1, "cancelled": 1, "cold_starts": 1}


def test_gpu_seconds_follow_token_shares() -> None:
    # One replica with 2 GPUs up for 120 s (two 60 s slices).
    intervals = [{"replica": "demo-1", "model": "demo", "gpus": 2, "started_at": 0.0, "ended_at": 120.0}]
    recs = [
        {"replica": "demo-1", "tenant": "a", "started_at": 10.0, "prompt_tokens": 30, "completion_tokens": 10},
        {"replica": "demo-1", "tenant": "b", "started_at": 20.0, "prompt_tokens": 10, "completion_tokens": 0},
        {"replica": "demo-1", "tenant": "b", "started_at": 70.0, "prompt_tokens": 5, "completion_tokens": 5},
    ]
    out = attribute_gpu_seconds(recs, intervals, now=200.0)
    # Slice 1: 60 s * 2 GPUs = 120 GPU-s, a has 40/50 tokens -> 96, b 10/50 -> 24.
    # Slice 2: 120 GPU-s, all b's.
    assert out == pytest.approx({"a": 96.0, "b": 24.0 + 120.0})


def test_usage_from_bodies_and_streams() -> None:
    u = Usage()
    usage_from_body(b'{"usage": {"prompt_tokens": 7, "completion_tokens": 3, '
                    b'"prompt_tokens_details": {"cached_tokens": 4}}}', u)
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.source) == (7, 3, 4, "engine")

    for forward in (True, False):
        u = Usage()
        tap = StreamTap(u, forward_usage_chunk=forward)
        stream = (b'data: {"choices": [{"delta": {"content": "a"}}], "usage": null}\n\n'
                  b'data: {"choices": [{"delta": {"content": "b"}}], "usage": null}\n\n'
                  b'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}\n\n'
                  b"data: [DONE]\n\n")
        out = []
        for i in range(0, len(stream), 7):  # events split across reads
            out += tap.feed(stream[i:i + 7])
        assert (u.prompt_tokens, u.completion_tokens, u.source) == (9, 2, "engine")
        assert len(out) == (4 if forward else 3)
        assert out[-1] == b"data: [DONE]\n\n" and tap.saw_done
        # Everything forwarded is byte-identical to what the engine sent.
        assert all(e in stream for e in out)

    u = Usage()
    tap = StreamTap(u, forward_usage_chunk=False)
    tap.feed(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: {"choices": [{"delta": {}}]}\n\n')
    assert (u.completion_tokens, u.source) == (2, "estimated")  # cut off before the usage chunk


def test_finish_reasons_are_read_only_when_asked_for() -> None:
    stream = (b'data: {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": null}]}\n\n'
              b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\n'
              b'data: {"choices": [{"index": 1, "delta": {}, "finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    for asked, reasons in ((True, ["length", "stop"]), (False, [])):
        u = Usage()
        tap = StreamTap(u, forward_usage_chunk=False, finish_reasons=asked)
        for i in range(0, len(stream), 11):
            tap.feed(stream[i:i + 11])
        assert u.finish_reasons == reasons
    u = Usage()
    usage_from_body(b'{"choices": [{"finish_reason": "tool_calls"}, {"finish_reason": null}], "usage": {}}', u)
    assert u.finish_reasons == ["tool_calls"]


LOADER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from activator.ledger import Ledger, UsageRecord

    async def main():
        ledger = Ledger(Path(sys.argv[1]), group_window_s=0.005)
        i = 0
        while True:
            await ledger.append(UsageRecord(
                request_id=f"r{i}", tenant="t", model="m", status=200, error_code=None, prompt_tokens=1,
                completion_tokens=1, cached_tokens=0, usage_source="engine", queue_ms=0.0, ttft_ms=1.0,
                duration_ms=1.0, cold_start=False, cancelled=False, stream=False, replica=None,
                started_at=float(i), finished_at=float(i)))
            # Only after the commit returned is the request "answered".
            print(f"acked r{i}", flush=True)
            i += 1

    asyncio.run(main())
""")


def test_sigkill_loses_no_acknowledged_record(tmp_path: Path) -> None:
    db = tmp_path / "u.db"
    proc = subprocess.Popen([sys.executable, "-c", LOADER, str(db)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    acked: list[str] = []
    assert proc.stdout is not None
    deadline = time.time() + 60
    while len(acked) < 200 and time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith("acked "):
            acked.append(line.split()[1])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(acked) >= 200
    stored = {r["request_id"] for r in query_usage(db)}
    assert set(acked) <= stored
