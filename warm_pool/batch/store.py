"""The Batches API's state: each batch and each of its lines, in the controller's state
database, so that a restarted controller (or the next leader) carries every batch on.

A line is ``pending`` until an activator leases it (``leased``, until its lease ends: a
lease that ends unanswered is pending again), then ``done`` (a 2xx response),
``refused`` (a response with an error status: the request was answered, and refused,
e.g. past the model's context) or ``failed`` (an error without a response; lines the
check refused are failed from the start). Refused and failed lines are the batch's
``failed`` count and its error file's lines, as OpenAI counts them. A line's result is
written once: the first answer for a line that is not finished wins and later ones are
ignored, so a line run twice (a lease that ended while its answer was on the way) is
counted once. The batch's statuses are OpenAI's; what moves a batch on (validating,
finalizing, expiry, cancelling) is the batch runner's, which calls these methods.
Blocking: the controller calls it from threads.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterator
from typing import Any

from thaw.batch_lines import CheckedLines
from thaw.wire import (
    BatchCounts,
    BatchLineError,
    BatchList,
    BatchRecord,
    BatchStatus,
    LeasedLine,
    NewBatch,
)
from warm_pool.db import Db, Tx

MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, created_at, id);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    custom_id TEXT,
    model TEXT,
    body TEXT,
    state TEXT NOT NULL,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION,
    result TEXT,
    finished_at DOUBLE PRECISION,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS batch_lines_by_state ON batch_lines (state, batch_id, line)
""",
    # Runs of a line that failed without an answer (its replica died, or answered 5xx).
    "ALTER TABLE batch_lines ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
]
# batches.body: the BatchRecord without its counts (JSON); batch_lines.result: for a done
# or refused line {"status_code", "request_id", "body"}, for a failed one {"code", "message"}.
# The states a line with a response ends in.
ANSWERED = ("done", "refused")

WINDOW_S = {"24h": 24 * 3600.0}
# A line whose run failed this many times without an answer is answered with an error.
MAX_LINE_FAILURES = 3
# Statuses in which lines are still handed out.
RUNNING: tuple[BatchStatus, ...] = ("in_progress",)
MAX_PAGE = 100


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def answered_ok(response: dict[str, Any]) -> bool:
    """Whether a line's response is a success (2xx): it goes to the output file."""
    return 200 <= int(response.get("status_code", 0)) < 300


class BatchStore:
    def __init__(self, db: Db) -> None:
        self.db = db
        db.migrate("batches", MIGRATIONS)

    # -- batches -------------------------------------------------------------------------

    def create(self, new: NewBatch, batch_id: str, at: float) -> BatchRecord:
        record = BatchRecord(id=batch_id, tenant=new.tenant, input_file_id=new.input_file_id, endpoint=new.endpoint,
                             completion_window=new.completion_window, metadata=new.metadata, status="validating",
                             created_at=at, expires_at=at + WINDOW_S[new.completion_window])
        with self.db.write() as tx:
            tx.execute("INSERT INTO batches (id, tenant, created_at, status, body) VALUES (?, ?, ?, ?, ?)",
                       (batch_id, new.tenant, at, record.status, record.model_dump_json()))
        return record

    def get(self, tenant: str | None, batch_id: str) -> BatchRecord | None:
        """The batch, if it is ``tenant``'s (None: whoever's, for the runner)."""
        with self.db.read() as tx:
            return self._get(tx, tenant, batch_id)

    def page(self, tenant: str, *, after: str | None = None, limit: int = 20) -> BatchList:
        """The tenant's batches, newest first; ``after``: the last id of the previous page."""
        where, params = ["tenant = ?"], [tenant]
        with self.db.read() as tx:
            if after is not None:
                cursor = tx.one("SELECT created_at, id FROM batches WHERE id = ? AND tenant = ?", (after, tenant))
                if cursor is not None:
                    where.append("(created_at < ? OR (created_at = ? AND id < ?))")
                    params += [cursor[0], cursor[0], cursor[1]]
            ids = [r[0] for r in tx.query(f"SELECT id FROM batches WHERE {' AND '.join(where)} "  # noqa: S608
                                          "ORDER BY created_at DESC, id DESC LIMIT ?", (*params, limit + 1))]
            found = [self._get(tx, tenant, i) for i in ids[:limit]]
        return BatchList(data=[b for b in found if b is not None], has_more=len(ids) > limit)

    def every(self, *, tenant: str | None = None, status: str | None = None, limit: int = MAX_PAGE) -> list[BatchRecord]:
        """The newest batches of every tenant (or ``tenant``'s), in ``status`` if given:
        the operators' view."""
        where, params = ["1 = 1"], []
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        with self.db.read() as tx:
            ids = [r[0] for r in tx.query(f"SELECT id FROM batches WHERE {' AND '.join(where)} "  # noqa: S608
                                          "ORDER BY created_at DESC, id DESC LIMIT ?", (*params, limit))]
            return [b for i in ids if (b := self._get(tx, None, i)) is not None]

    def in_status(self, *statuses: BatchStatus) -> list[BatchRecord]:
        """Every batch in one of ``statuses`` (the runner's work), oldest first."""
        marks = ", ".join("?" for _ in statuses)
        with self.db.read() as tx:
            ids = [r[0] for r in tx.query(f"SELECT id FROM batches WHERE status IN ({marks}) "  # noqa: S608
                                          "ORDER BY created_at, id", statuses)]
            return [b for i in ids if (b := self._get(tx, None, i)) is not None]

    def validated(self, batch_id: str, checked: CheckedLines, at: float) -> BatchRecord:
        """The input was read and checked: its lines are kept (refused ones as failed) and
        the batch runs; a file that is not JSONL fails the batch."""
        with self.db.write() as tx:
            record = self._get(tx, None, batch_id)
            assert record is not None, batch_id
            if record.status != "validating":  # cancelled meanwhile
                return record
            if checked.not_jsonl is not None:
                return self._move(tx, record, "failed", at, errors=[
                    BatchLineError(code="invalid_file", message=checked.not_jsonl, param="input_file_id")])
            tx.execute_many(
                "INSERT INTO batch_lines (batch_id, line, custom_id, model, body, state) VALUES (?, ?, ?, ?, ?, ?)",
                [(batch_id, r.line, r.custom_id, r.model, json.dumps(r.body), "pending") for r in checked.requests])
            tx.execute_many(
                "INSERT INTO batch_lines (batch_id, line, custom_id, state, result, finished_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(batch_id, e.line, e.custom_id, "failed",
                  json.dumps({"code": e.code, "message": f"line {e.line}: {e.message}", "param": e.param}), at)
                 for e in checked.errors])
            return self._move(tx, record, "in_progress", at)

    def fail(self, batch_id: str, error: BatchLineError, at: float) -> BatchRecord:
        """The batch cannot run at all (its input file is gone or unreadable)."""
        with self.db.write() as tx:
            record = self._get(tx, None, batch_id)
            assert record is not None, batch_id
            return self._move(tx, record, "failed", at, errors=[error])

    def cancel(self, tenant: str, batch_id: str, at: float) -> BatchRecord | None:
        """Stop handing out the batch's lines; lines being run may still finish. None: not
        the tenant's batch. A batch that has ended is returned as it is."""
        with self.db.write() as tx:
            record = self._get(tx, tenant, batch_id)
            if record is None or record.status not in ("validating", "in_progress"):
                return record
            return self._move(tx, record, "cancelling", at)

    def move(self, batch_id: str, status: BatchStatus, at: float, **fields: Any) -> BatchRecord:
        """The runner moves a batch on (finalizing, completed, expired, cancelled), with
        e.g. its output and error files."""
        with self.db.write() as tx:
            record = self._get(tx, None, batch_id)
            assert record is not None, batch_id
            return self._move(tx, record, status, at, **fields)

    # -- lines ---------------------------------------------------------------------------

    def lease(self, owner: str, models: Collection[str], n: int, at: float, lease_s: float,
              renew: Collection[tuple[str, int]] = ()) -> list[LeasedLine]:
        """Up to ``n`` lines of running batches for ``models``, oldest batch first, leased
        to ``owner`` until ``at + lease_s``; a lease that ended unanswered is taken again.
        ``renew``: (batch id, line) of lines ``owner`` runs, whose leases it still holds,
        held until then too (a lease is short: one its owner lost is taken again soon)."""
        until = at + lease_s
        if renew:
            with self.db.write() as tx:
                tx.execute_many("UPDATE batch_lines SET lease_until = ? WHERE batch_id = ? AND line = ? "
                                "AND state = 'leased' AND lease_owner = ?",
                                [(until, b, line, owner) for b, line in renew])
        if not models or n <= 0:
            return []
        marks = ", ".join("?" for _ in models)
        with self.db.read() as tx:  # most asks find nothing: no write lock for them
            if tx.one("SELECT 1 FROM batches WHERE status = 'in_progress' LIMIT 1") is None:
                return []
        with self.db.write() as tx:
            rows = tx.query(
                "SELECT l.batch_id, l.line, l.custom_id, l.model, l.body, b.body FROM batch_lines l "
                "JOIN batches b ON b.id = l.batch_id "
                f"WHERE b.status = 'in_progress' AND l.model IN ({marks}) "  # noqa: S608
                "AND (l.state = 'pending' OR (l.state = 'leased' AND l.lease_until < ?)) "
                "ORDER BY b.created_at, l.batch_id, l.line LIMIT ?", (*models, at, n))
            tx.execute_many("UPDATE batch_lines SET state = 'leased', lease_owner = ?, lease_until = ? "
                            "WHERE batch_id = ? AND line = ?", [(owner, until, r[0], r[1]) for r in rows])
        out = []
        for b, line, cid, model, body, batch in rows:
            record = BatchRecord.model_validate_json(batch)
            out.append(LeasedLine(batch_id=b, tenant=record.tenant, line=line, custom_id=cid, model=model,
                                  body=json.loads(body), endpoint=record.endpoint, lease_until=until))
        return out

    def finish(self, batch_id: str, line: int, *, response: dict[str, Any] | None = None,
               error: dict[str, Any] | None = None, at: float) -> bool:
        """Keep a line's result (a response, else an error) unless it has one already;
        whether this one is the kept one (also when it is sent again: a response with the
        request id of the one kept, whose first reply was lost)."""
        assert (response is None) != (error is None)
        state, result = (("done" if answered_ok(response) else "refused"), response) if response is not None \
            else ("failed", error)
        with self.db.write() as tx:
            changed = tx.execute(
                "UPDATE batch_lines SET state = ?, result = ?, finished_at = ?, lease_owner = NULL, "
                "lease_until = NULL WHERE batch_id = ? AND line = ? AND state IN ('pending', 'leased')",
                (state, json.dumps(result), at, batch_id, line))
            if changed == 1:
                return True
            if response is None or response.get("request_id") is None:
                return False
            row = tx.one("SELECT result FROM batch_lines WHERE batch_id = ? AND line = ? AND state IN (?, ?)",
                         (batch_id, line, *ANSWERED))
        return row is not None and json.loads(row[0]).get("request_id") == response["request_id"]

    def release(self, batch_id: str, line: int, owner: str, *, failure: str | None = None,
                at: float | None = None) -> None:
        """Give a leased line back unanswered: pending again at once. ``failure``: its run
        failed (a replica that died, or answered 5xx), not cut for online traffic; the
        MAX_LINE_FAILURES-th such failure answers the line with a server error."""
        with self.db.write() as tx:
            if failure is None:
                tx.execute("UPDATE batch_lines SET state = 'pending', lease_owner = NULL, lease_until = NULL "
                           "WHERE batch_id = ? AND line = ? AND state = 'leased' AND lease_owner = ?",
                           (batch_id, line, owner))
                return
            tx.execute("UPDATE batch_lines SET state = 'pending', lease_owner = NULL, lease_until = NULL, "
                       "failures = failures + 1 WHERE batch_id = ? AND line = ? AND state = 'leased' "
                       "AND lease_owner = ?", (batch_id, line, owner))
            error = {"code": "server_error",
                     "message": f"the request failed {MAX_LINE_FAILURES} times without an answer: {failure}"}
            tx.execute("UPDATE batch_lines SET state = 'failed', result = ?, finished_at = ? "
                       "WHERE batch_id = ? AND line = ? AND state = 'pending' AND failures >= ?",
                       (json.dumps(error), at or 0.0, batch_id, line, MAX_LINE_FAILURES))

    def close_unanswered(self, batch_id: str, error: dict[str, Any], at: float) -> int:
        """A batch that expired or was cancelled: each line without a result gets
        ``error`` as its result (an answer that comes later is ignored, so the counts and
        the files agree). How many."""
        with self.db.write() as tx:
            return tx.execute("UPDATE batch_lines SET state = 'failed', result = ?, finished_at = ?, "
                              "lease_owner = NULL, lease_until = NULL WHERE batch_id = ? "
                              "AND state IN ('pending', 'leased')", (json.dumps(error), at, batch_id))

    def unfinished(self, batch_id: str, at: float) -> tuple[int, int]:
        """(pending lines, lines leased now) of the batch."""
        with self.db.read() as tx:
            row = tx.one("SELECT SUM(CASE WHEN state = 'pending' OR (state = 'leased' AND lease_until < ?) "
                         "THEN 1 ELSE 0 END), SUM(CASE WHEN state = 'leased' AND lease_until >= ? THEN 1 ELSE 0 END) "
                         "FROM batch_lines WHERE batch_id = ?", (at, at, batch_id))
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

    def results(self, batch_id: str) -> Iterator[tuple[int, str | None, str, dict[str, Any] | None]]:
        """Each finished line in input order: (line, custom_id, state, result)."""
        with self.db.read() as tx:
            rows = tx.query("SELECT line, custom_id, state, result FROM batch_lines "
                            "WHERE batch_id = ? AND state IN (?, ?, ?) ORDER BY line", (batch_id, *ANSWERED, "failed"))
        for line, cid, state, result in rows:
            yield line, cid, state, json.loads(result) if result else None

    def census(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """Batches by status, and lines of batches not yet ended by (model, state)."""
        with self.db.read() as tx:
            batches = {s: int(n) for s, n in tx.query("SELECT status, COUNT(*) FROM batches GROUP BY status")}
            lines = {(m or "-", st): int(n) for m, st, n in tx.query(
                "SELECT l.model, l.state, COUNT(*) FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
                "WHERE b.status IN ('in_progress', 'cancelling', 'finalizing') GROUP BY l.model, l.state")}
        return batches, lines

    def pending_models(self) -> dict[str, int]:
        """Lines not yet answered per model, over running batches (what batch asks of
        the pool)."""
        with self.db.read() as tx:
            rows = tx.query("SELECT l.model, COUNT(*) FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
                            "WHERE b.status = 'in_progress' AND l.state IN ('pending', 'leased') GROUP BY l.model")
        return {m: int(c) for m, c in rows}

    # -- internals -----------------------------------------------------------------------

    def _get(self, tx: Tx, tenant: str | None, batch_id: str) -> BatchRecord | None:
        row = tx.one("SELECT tenant, body FROM batches WHERE id = ?", (batch_id,))
        if row is None or (tenant is not None and row[0] != tenant):
            return None
        record = BatchRecord.model_validate_json(row[1])
        counts = dict(tx.query("SELECT state, COUNT(*) FROM batch_lines WHERE batch_id = ? GROUP BY state",
                               (batch_id,)))
        total = sum(int(c) for c in counts.values())
        return record.model_copy(update={"request_counts": BatchCounts(
            total=total, completed=int(counts.get("done", 0)),
            failed=int(counts.get("failed", 0)) + int(counts.get("refused", 0)))})

    @staticmethod
    def _move(tx: Tx, record: BatchRecord, status: BatchStatus, at: float, **fields: Any) -> BatchRecord:
        stamp = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
                 "failed": "failed_at", "expired": "expired_at", "cancelling": "cancelling_at",
                 "cancelled": "cancelled_at"}.get(status)
        update = {"status": status, **fields, **({stamp: at} if stamp else {})}
        moved = record.model_copy(update=update)
        stored = moved.model_copy(update={"request_counts": BatchCounts()})
        tx.execute("UPDATE batches SET status = ?, body = ? WHERE id = ?",
                   (status, stored.model_dump_json(), record.id))
        return moved
