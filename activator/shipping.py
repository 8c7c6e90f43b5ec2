"""Shipping the usage ledger to the object store, so that usage covers every activator.

Each activator keeps its own SQLite ledger, and the durability promise stays local: a
record is committed there before the client sees the end of its answer. Every
``ledger.ship_interval_s`` the shipper seals the records past its watermark (at most
``ledger.ship_max_records``) into one immutable segment,

    <ship_prefix><activator-id>/<first-id:012d>-<last-id:012d>.jsonl.gz

gzip JSON lines, one ledger row each with its row ``id`` and the ``activator``; PUTs
it; and only then moves the watermark kept in the ledger file (table
``usage_shipped``), so a restart continues where the last commit left off. The range
is decided from the local ledger alone: after a crash between the PUT and that commit,
the same rows go out again (in the same segment, or a wider one if more arrived).
Readers count each record once per (activator, id).

Next to its segments each activator keeps two small objects that it overwrites:
``shipped.json`` (every tick: through which row, and as of when every committed record
was in the store; readers state the lag from it) and ``replicas.json.gz`` (the replica
intervals it saw, for GPU-second attribution; written when they change).

Nothing here is on the request path: a store that is down only makes the lag grow,
and the next tick ships what waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activator.metrics import ActivatorMetrics
from thaw.log import get_logger
from thaw.s3client import S3Client

log = get_logger()

MARKER_NAME = "shipped.json"
REPLICAS_NAME = "replicas.json.gz"
_SEGMENT_NAME = re.compile(r"^(\d{12})-(\d{12})\.jsonl\.gz$")
# For the store's client: a tick against a store that is down fails in seconds, not minutes.
CLIENT_CONFIG: dict[str, Any] = {"connect_timeout": 3, "read_timeout": 10,
                                 "retries": {"max_attempts": 2, "mode": "standard"}}
# Shutdown waits at most this long for the last ship; what it misses goes on the next start.
FINAL_SHIP_TIMEOUT_S = 10.0

WATERMARK_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage_shipped (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    activator TEXT NOT NULL,
    last_id INTEGER NOT NULL,
    covered_through REAL NOT NULL,
    shipped_at REAL NOT NULL
)
"""


# -- the format ------------------------------------------------------------------------


def segment_key(prefix: str, activator: str, first_id: int, last_id: int) -> str:
    # Zero-padded so that names sort in row order.
    return f"{prefix}{activator}/{first_id:012d}-{last_id:012d}.jsonl.gz"


def parse_segment_key(prefix: str, key: str) -> tuple[str, int, int] | None:
    """(activator, first id, last id) of a segment's key; None for any other object."""
    if not key.startswith(prefix):
        return None
    activator, _, name = key[len(prefix):].partition("/")
    m = _SEGMENT_NAME.match(name)
    if not activator or m is None:
        return None
    return activator, int(m.group(1)), int(m.group(2))


def encode_lines(rows: Iterable[dict[str, Any]]) -> bytes:
    """Gzip JSON lines; ``mtime=0`` so that the same rows always give the same bytes."""
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    return gzip.compress(text.encode(), mtime=0)


def decode_lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.decompress(body).splitlines() if line.strip()]


# -- the watermark in the ledger file ---------------------------------------------------


@dataclass(frozen=True)
class Watermark:
    """How far an activator's ledger is shipped."""

    activator: str
    last_id: int
    # Every record committed before this time had been shipped (as of the shipper's read).
    covered_through: float
    shipped_at: float


def _watermark(conn: sqlite3.Connection) -> Watermark | None:
    row = conn.execute("SELECT activator, last_id, covered_through, shipped_at FROM usage_shipped").fetchone()
    return Watermark(*row) if row else None


def read_watermark(path: Path) -> Watermark | None:
    """The watermark of the ledger at ``path`` (read-only; None when it never shipped)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'usage_shipped'").fetchone()
        return _watermark(conn) if has else None
    finally:
        conn.close()


# -- the shipper -----------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """The records past the watermark, read at one moment from the ledger."""

    activator: str
    after_id: int
    rows: list[dict[str, Any]]
    # Records finished before this are in this batch or shipped before it.
    covered_through: float
    # More records wait past max_records.
    more: bool

    @property
    def through_id(self) -> int:
        return self.rows[-1]["id"] if self.rows else self.after_id

    def key(self, prefix: str) -> str:
        return segment_key(prefix, self.activator, self.rows[0]["id"], self.rows[-1]["id"])

    def body(self) -> bytes:
        return encode_lines({**r, "activator": self.activator} for r in self.rows)


class UsageShipper:
    """Ships one activator's ledger in sealed segments (see the module's docstring).

    ``ship_once`` is one tick and never raises; the blocking steps (``read_batch``,
    ``put_segment``, ``commit``, ``put_marker``, ``put_replicas``) run in a thread, one
    ship at a time."""

    def __init__(
        self, ledger_path: Path, activator_id: str, client: S3Client, bucket: str, *, prefix: str = "usage/",
        interval_s: float = 10.0, max_records: int = 5000, metrics: ActivatorMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger_path = Path(ledger_path)
        self.activator_id = activator_id
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.interval_s = interval_s
        self.max_records = max_records
        self.metrics = metrics
        self.clock = clock
        self.covered_through: float | None = None
        self.consecutive_failures = 0
        self._lock = threading.Lock()  # the loop's ship and the final one never overlap
        self._replicas_digest: str | None = None
        self._task: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.usage_ship_lag.set_function(self.lag_s)

    def lag_s(self) -> float:
        """Seconds since the oldest record not known to be in the store was committed,
        or since the last successful ship."""
        return max(0.0, self.clock() - self.covered_through) if self.covered_through is not None else 0.0

    # blocking steps --------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.ledger_path, timeout=30, isolation_level=None)
        conn.execute(WATERMARK_SCHEMA)
        conn.row_factory = sqlite3.Row
        return conn

    def read_batch(self) -> Batch:
        conn = self._connect()
        try:
            wm = _watermark(conn)
            after = wm.last_id if wm else 0
            now = self.clock()
            rows = [dict(r) for r in conn.execute("SELECT * FROM usage WHERE id > ? ORDER BY id LIMIT ?",
                                                  (after, self.max_records))]
            more = len(rows) == self.max_records
            covered = now
            if more:
                # Records committed later may have finished earlier than the batch's last.
                (oldest,) = conn.execute("SELECT MIN(finished_at) FROM usage WHERE id > ?",
                                         (rows[-1]["id"],)).fetchone()
                covered = min(now, oldest) if oldest is not None else now
            return Batch(self.activator_id, after, rows, covered, more)
        finally:
            conn.close()

    def put_segment(self, batch: Batch) -> None:
        self.client.put_object(Bucket=self.bucket, Key=batch.key(self.prefix), Body=batch.body(),
                               ContentType="application/x-ndjson")

    def commit(self, batch: Batch) -> None:
        """Move the watermark past ``batch`` (after its PUT succeeded); never backwards."""
        conn = self._connect()
        try:
            conn.execute(
                "INSERT INTO usage_shipped (one, activator, last_id, covered_through, shipped_at) "
                "VALUES (1, ?, ?, ?, ?) ON CONFLICT (one) DO UPDATE SET activator = excluded.activator, "
                "last_id = max(last_id, excluded.last_id), covered_through = excluded.covered_through, "
                "shipped_at = excluded.shipped_at",
                (self.activator_id, batch.through_id, batch.covered_through, self.clock()))
        finally:
            conn.close()

    def put_marker(self, batch: Batch) -> None:
        body = json.dumps({"activator": self.activator_id, "through_id": batch.through_id,
                           "covered_through": batch.covered_through, "written_at": self.clock()}).encode()
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{self.activator_id}/{MARKER_NAME}",
                               Body=body, ContentType="application/json")

    def put_replicas(self) -> None:
        conn = self._connect()
        try:
            rows = [dict(r) for r in conn.execute("SELECT * FROM replica_intervals ORDER BY started_at, replica")]
        finally:
            conn.close()
        body = encode_lines(rows)
        digest = hashlib.sha256(body).hexdigest()
        if digest == self._replicas_digest:
            return
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{self.activator_id}/{REPLICAS_NAME}",
                               Body=body, ContentType="application/x-ndjson")
        self._replicas_digest = digest

    def ship_blocking(self) -> int:
        """Ship everything committed so far; returns the number of records shipped."""
        with self._lock:
            shipped = 0
            while True:
                batch = self.read_batch()
                if batch.rows:
                    self.put_segment(batch)
                    self.commit(batch)
                    shipped += len(batch.rows)
                    if self.metrics is not None:
                        self.metrics.usage_shipped_records.inc(len(batch.rows))
                        self.metrics.usage_shipped_segments.inc()
                if not batch.more:
                    break
            self.put_marker(batch)
            self.put_replicas()
            self.covered_through = batch.covered_through
            return shipped

    def _initial_covered_through(self) -> float:
        conn = self._connect()
        try:
            wm = _watermark(conn)
            if wm is not None:
                return wm.covered_through
            (oldest,) = conn.execute("SELECT MIN(finished_at) FROM usage").fetchone()
            return float(oldest) if oldest is not None else self.clock()
        finally:
            conn.close()

    # the loop ----------------------------------------------------------------------------

    async def ship_once(self) -> int | None:
        """One tick: the number of records shipped, or None if it failed (logged, counted;
        the next tick tries again)."""
        try:
            n = await asyncio.to_thread(self.ship_blocking)
        except Exception as exc:
            self.consecutive_failures += 1
            if self.metrics is not None:
                self.metrics.usage_ship_failures.inc()
            log.warning("usage_ship_failed", error=str(exc), consecutive_failures=self.consecutive_failures,
                        lag_s=round(self.lag_s(), 1))
            return None
        if self.consecutive_failures:
            log.info("usage_ship_recovered", after_failures=self.consecutive_failures, records=n)
        self.consecutive_failures = 0
        return n

    async def start(self) -> None:
        try:
            self.covered_through = await asyncio.to_thread(self._initial_covered_through)
        except Exception as exc:
            log.warning("usage_ship_state_unreadable", error=str(exc))
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        # At once on start: a restarted activator ships what it left behind first.
        while True:
            await self.ship_once()
            await asyncio.sleep(self.interval_s)

    async def close(self, final_timeout_s: float = FINAL_SHIP_TIMEOUT_S) -> None:
        """Stop the loop, then try one last ship (after the ledger's last commit) for at
        most ``final_timeout_s``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await asyncio.wait_for(self.ship_once(), final_timeout_s)
        except TimeoutError:
            log.warning("usage_final_ship_timed_out", timeout_s=final_timeout_s)
