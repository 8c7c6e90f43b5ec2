"""The usage ledger: one append-only record per request, in SQLite (WAL).

Durability guarantee: a request's record is committed (WAL, ``synchronous=FULL``)
before the client receives the end of its answer — the ``data: [DONE]`` of a stream,
the body of a non-streamed response, or the error body. So any request whose answer a
client saw complete is in the ledger, even if the activator is SIGKILLed right after.
Requests cut off by a crash before that point may be missing; cancelled streams are
recorded when the activator notices the disconnect.

Writes go through one thread that owns the connection and commits in groups: the
records that queued up while the previous commit ran share the next one (one fsync),
so a busy activator commits in batches without a lone record ever waiting for company;
``group_window_s`` (default 0) adds a wait for more records before each commit. Each
caller awaits the commit of its own record.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from thaw.log import get_logger

log = get_logger()

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    model TEXT,
    status INTEGER NOT NULL,
    error_code TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    usage_source TEXT NOT NULL,
    queue_ms REAL NOT NULL DEFAULT 0,
    ttft_ms REAL,
    duration_ms REAL NOT NULL,
    cold_start INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0,
    stream INTEGER NOT NULL DEFAULT 0,
    replica TEXT,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    revision INTEGER,
    service_tier TEXT
);
CREATE INDEX IF NOT EXISTS usage_tenant_time ON usage (tenant, started_at);
CREATE TABLE IF NOT EXISTS replica_intervals (
    replica TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL
);
"""


MIGRATED_COLUMNS = (("revision", "INTEGER"), ("service_tier", "TEXT"))


@dataclass(frozen=True)
class UsageRecord:
    request_id: str
    tenant: str
    model: str | None
    status: int
    error_code: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # 'engine': counts reported by the engine; 'estimated': counted by the activator
    # (a stream cut off before the engine's usage chunk); 'none': no tokens (an error
    # before any GPU work).
    usage_source: str
    queue_ms: float
    ttft_ms: float | None
    duration_ms: float
    cold_start: bool
    cancelled: bool
    stream: bool
    replica: str | None
    started_at: float
    finished_at: float
    # The model's registry revision that answered (None: not known).
    revision: int | None = None
    # OpenAI's service tier: "batch" for a line of a batch (priced at
    # batch.price_factor); None for an online request.
    service_tier: str | None = None


_COLUMNS = [f.name for f in fields(UsageRecord)]
_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"


class Ledger:
    """Append usage records; ``await append(r)`` returns once ``r`` is committed."""

    def __init__(self, path: Path, *, group_window_s: float = 0.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.group_window_s = group_window_s
        # SimpleQueue: the event loop's put takes no lock and no condition (queue.Queue's do).
        self._queue: queue.SimpleQueue[tuple[str, Any, asyncio.Future[None] | None, asyncio.AbstractEventLoop | None] | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error:
            raise self._error

    @staticmethod
    def connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(SCHEMA)
        # Columns added since the first ledgers (their rows have none: NULL).
        have = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
        for column, kind in MIGRATED_COLUMNS:
            if column not in have:
                conn.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
        return conn

    def _run(self) -> None:
        try:
            conn = self.connect(self.path)
        except BaseException as exc:  # surfaced to the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self.group_window_s
            stop = False
            while True:
                # Everything queued meanwhile (records that arrived during the last
                # commit) joins this one; then wait out the window, if one is set.
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                    try:
                        item = self._queue.get(timeout=timeout)
                    except queue.Empty:
                        break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            error: BaseException | None = None
            try:
                self._commit(conn, batch)
            except BaseException as exc:
                error = exc
                log.exception("ledger_commit_failed", records=len(batch))
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            # One wake-up of each waiting loop for the whole batch, not one per record
            # (each is a write to the loop's self-pipe and a turn of the loop).
            waiting: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            for _, _, fut, loop in batch:
                if fut is not None and loop is not None:
                    waiting.setdefault(loop, []).append(fut)
            for loop, futs in waiting.items():
                loop.call_soon_threadsafe(_settle_all, futs, error)
            if stop:
                break
        conn.close()

    @classmethod
    def _commit(cls, conn: sqlite3.Connection, batch: list[tuple[str, Any, Any, Any]]) -> None:
        """One transaction for the batch. The sqlite3 module lets go of the GIL around each
        statement and takes it back after, and each time the event loop's thread may have
        to hand it over: so a lone record is one statement (its own transaction, as
        durable), and a batch's usage records are one ``executemany``."""
        if len(batch) == 1 and batch[0][0] == "usage":
            record = batch[0][1]
            conn.execute(_INSERT, [getattr(record, c) for c in _COLUMNS])
            return
        conn.execute("BEGIN")
        conn.executemany(_INSERT, [[getattr(p, c) for c in _COLUMNS] for k, p, _, _ in batch if k == "usage"])
        for kind, payload, _, _ in batch:
            if kind != "usage":
                cls._write(conn, kind, payload)
        conn.execute("COMMIT")

    @staticmethod
    def _write(conn: sqlite3.Connection, kind: str, payload: Any) -> None:
        if kind == "replica_up":
            conn.execute(
                "INSERT OR IGNORE INTO replica_intervals (replica, model, gpus, started_at) VALUES (?, ?, ?, ?)",
                payload,
            )
        elif kind == "replica_down":
            conn.execute("UPDATE replica_intervals SET ended_at = ? WHERE replica = ? AND ended_at IS NULL",
                         payload)

    async def append(self, record: UsageRecord) -> None:
        """Queue ``record`` and wait until it is committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put(("usage", record, fut, loop))
        await fut

    def replica_up(self, replica: str, model: str, gpus: int, at: float) -> None:
        self._queue.put(("replica_up", (replica, model, gpus, at), None, None))

    def replica_down(self, replica: str, at: float) -> None:
        self._queue.put(("replica_down", (at, replica), None, None))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)


def _settle_all(futs: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for fut in futs:
        if fut.done():  # its request went away meanwhile
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


# -- reading (the `thaw usage` command and GET /v1/usage) ------------------------------


def query_usage(
    path: Path, *, tenant: str | None = None, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """Records, oldest first, optionally for one tenant and a time window."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        conn.row_factory = sqlite3.Row
        where: list[str] = []
        args: list[str | float] = []
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        if until is not None:
            where.append("started_at < ?")
            args.append(until)
        if not _has_table(conn, "usage"):
            return []  # the file exists (e.g. keys were added) but nothing was metered yet
        sql = "SELECT * FROM usage" + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY id"
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def replica_intervals(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        conn.row_factory = sqlite3.Row
        if not _has_table(conn, "replica_intervals"):
            return []
        return [dict(r) for r in conn.execute("SELECT * FROM replica_intervals ORDER BY started_at")]
    finally:
        conn.close()


def attribute_gpu_seconds(
    records: Iterable[dict[str, Any]], intervals: Iterable[dict[str, Any]], now: float, bucket_s: float = 60.0,
    by: Callable[[dict[str, Any]], Hashable] = lambda r: r["tenant"],
) -> dict[Any, float]:
    """GPU-seconds per tenant (or per ``by`` of a record: tenant and model, say): each
    replica's time (× its GPUs), split in ``bucket_s`` slices among the tenants by their
    share of the tokens that replica served in the slice. Slices in which a replica
    served nobody stay unattributed (idle cost)."""
    tokens: dict[tuple[str, int], dict[Any, int]] = {}
    for r in records:
        if not r.get("replica"):
            continue
        key = (r["replica"], int(r["started_at"] // bucket_s))
        per = tokens.setdefault(key, {})
        who = by(r)
        per[who] = per.get(who, 0) + r["prompt_tokens"] + r["completion_tokens"]
    out: dict[Any, float] = {}
    for iv in intervals:
        start, end = iv["started_at"], iv["ended_at"] or now
        b = int(start // bucket_s)
        while b * bucket_s < end:
            lo, hi = max(start, b * bucket_s), min(end, (b + 1) * bucket_s)
            per = tokens.get((iv["replica"], b)) or {}
            total = sum(per.values())
            if total and hi > lo:
                gpu_s = (hi - lo) * max(iv["gpus"], 1)
                for t, n in per.items():
                    out[t] = out.get(t, 0.0) + gpu_s * n / total
            b += 1
    return out


def usage_totals(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sums over records: requests, tokens, errors, cold starts."""
    rs = list(records)
    return {
        "requests": len(rs),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rs),
        "completion_tokens": sum(r["completion_tokens"] for r in rs),
        "cached_tokens": sum(r["cached_tokens"] for r in rs),
        "errors": sum(1 for r in rs if r["status"] >= 400),
        "cancelled": sum(1 for r in rs if r["cancelled"]),
        "cold_starts": sum(1 for r in rs if r["cold_start"]),
    }


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds, an ISO 8601 time, or a duration back from now ('15m', '2h', '7d')."""
    from datetime import datetime

    from activator.errors import BadRequest

    if value is None or value == "":
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if value[-1] in units and value[:-1].replace(".", "", 1).isdigit():
            return time.time() - float(value[:-1]) * units[value[-1]]
        try:
            return float(value)
        except ValueError:
            dt = datetime.fromisoformat(value)
            return dt.timestamp()
    except ValueError:
        raise BadRequest(f"'{name}' must be epoch seconds, an ISO time or a duration like 15m/2h/7d",
                         param=name) from None
