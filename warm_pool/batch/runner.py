"""The leader's batch work (the Batches API's control loop): each tick it

- validates new batches: reads the input file from the store and checks it line by line
  (``thaw.batch_lines``), for the models the batch's tenant may use;
- finishes batches: one whose lines are all answered is finalized (its output and error
  files written and indexed) and completed; one past its window is finalized with what
  is answered and expired, its unanswered lines in the error file; a cancelled one, once
  no line is being run, is finalized with what is answered and cancelled.

What to do with a batch is :func:`batch_step` (pure, time passed in); the files are
written by this shell. Finalizing is idempotent: the output and error files' ids follow
from the batch's, so a controller that dies while finalizing (a ``finalizing`` batch)
writes the same files again.

The output file holds the answered requests in input order (OpenAI does not promise an
order; Thaw keeps the input's); the error file holds, in input order, the lines the check
refused, the requests the engine answered with an error, and (expired) the lines never
answered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from collections.abc import Callable
from typing import Any, Literal

from thaw.batch_lines import check_lines
from thaw.log import get_logger
from thaw.wire import BatchLineError, BatchRecord, NewFile
from warm_pool.batch.files import FileExists, FileIndex
from warm_pool.batch.store import ANSWERED, BatchStore, answered_ok
from warm_pool.metrics import PoolMetrics

log = get_logger()

Step = Literal["finalize", "expire", "cancel"]
EXPIRED = {"code": "batch_expired",
           "message": "This request could not be executed before the completion window expired."}
CANCELLED = {"code": "batch_cancelled", "message": "This request was not executed: the batch was cancelled."}


def batch_step(b: BatchRecord, pending: int, leased: int, now: float) -> Step | None:
    """What a running batch needs now, if anything: ``pending`` lines wait for an
    activator, ``leased`` ones are being run."""
    if b.status == "cancelling":
        return "cancel" if leased == 0 else None
    if b.status == "finalizing":
        return "finalize"
    if b.status != "in_progress":
        return None
    if pending == 0 and leased == 0:
        return "finalize"
    if now >= b.expires_at:
        return "expire"
    return None


def result_file_id(batch_id: str, kind: Literal["output", "error"]) -> str:
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:32]


def request_id(batch_id: str, line: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:24]


def refusal(result: dict[str, Any] | None, line: int) -> dict[str, Any]:
    """The error entry of a line the engine or activator answered with an error status:
    the answer's own code and message, with the line's number."""
    body = (result or {}).get("body")
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    status = (result or {}).get("status_code")
    return {"code": err.get("code") or f"http_{status}",
            "message": f"line {line}: {err.get('message') or f'answered with status {status}'}", "line": line}


class BatchRunner:
    """``client``: a boto3 S3 client of the object store, made on first use (None: no
    store, and every batch fails its validation); ``resolver(tenant)``: that tenant's
    model resolution for :func:`check_lines`; ``leading``: whether this controller acts."""

    def __init__(self, store: BatchStore, files: FileIndex, client: Callable[[], Any] | None, bucket: str,
                 files_prefix: str, resolver: Callable[[str], Callable[[str], str | None]],
                 clock: Callable[[], float], leading: Callable[[], bool] = lambda: True,
                 interval_s: float = 1.0, metrics: PoolMetrics | None = None) -> None:
        self.store = store
        self.files = files
        self._client_factory = client
        self._client: Any = None
        self.bucket = bucket
        self.files_prefix = files_prefix
        self.resolver = resolver
        self.clock = clock
        self.leading = leading
        self.interval_s = interval_s
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Per model, the lines of running batches not answered yet, as of the last tick
        # (what batch asks of the pool: warm_pool.policy.batch).
        self.demand: dict[str, int] = {}
        # The last tick's batches by status, and lines of running batches by (model, state).
        self.census: tuple[dict[str, int], dict[tuple[str, str], int]] = ({}, {})
        # Called when the models with batch work change (the pool decides again now).
        self.on_demand: Callable[[], None] | None = None

    def kick(self) -> None:
        """Look now (a batch was created or cancelled)."""
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch_runner")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            if self.leading():
                try:
                    await self.tick()
                except Exception:
                    log.exception("batch_tick_failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass

    async def tick(self) -> None:
        for b in await asyncio.to_thread(self.store.in_status, "validating"):
            await asyncio.to_thread(self._validate, b)
        for b in await asyncio.to_thread(self.store.in_status, "in_progress", "cancelling", "finalizing"):
            now = self.clock()
            pending, leased = await asyncio.to_thread(self.store.unfinished, b.id, now)
            step = batch_step(b, pending, leased, now)
            if step is not None:
                await asyncio.to_thread(self._finish, b, step)
        demand = await asyncio.to_thread(self.store.pending_models)
        if demand.keys() != self.demand.keys() and self.on_demand is not None:
            self.demand = demand
            self.on_demand()
        self.demand = demand
        batches, lines = await asyncio.to_thread(self.store.census)
        self.census = (batches, lines)
        if self.metrics is not None:
            self.metrics.batches.clear()
            for status, n in batches.items():
                self.metrics.batches.labels(status).set(n)
            self.metrics.batch_lines.clear()
            for (model, state), n in lines.items():
                self.metrics.batch_lines.labels(model, state).set(n)

    # -- blocking steps --------------------------------------------------------------------

    def _s3(self) -> Any:
        if self._client is None:
            if self._client_factory is None:
                raise RuntimeError("no object store is configured")
            self._client = self._client_factory()
        return self._client

    def _validate(self, b: BatchRecord) -> None:
        record = self.files.get(b.tenant, b.input_file_id)
        if record is None:
            self.store.fail(b.id, BatchLineError(code="invalid_input_file", param="input_file_id",
                                                 message=f"the input file {b.input_file_id} no longer exists"),
                            self.clock())
            return
        if self._client_factory is None:
            self.store.fail(b.id, BatchLineError(code="store_unavailable", message="the controller has no object "
                                                 "store configured, so it cannot read batch input"), self.clock())
            return
        try:
            body = self._s3().get_object(Bucket=self.bucket, Key=record.key)["Body"]
            try:
                checked = check_lines(body.iter_lines(), b.endpoint, self.resolver(b.tenant))
            finally:
                body.close()
        except Exception as exc:  # the store is away: try again next tick
            log.warning("batch_input_unreadable", batch_id=b.id, file_id=record.id, error=repr(exc))
            return
        done = self.store.validated(b.id, checked, self.clock())
        log.info("batch_validated", batch_id=b.id, status=done.status, requests=len(checked.requests),
                 refused=len(checked.errors))

    def _finish(self, b: BatchRecord, step: Step) -> None:
        if step == "finalize" and b.status == "in_progress":
            b = self.store.move(b.id, "finalizing", self.clock())
        if step in ("expire", "cancel"):
            # The lines without a result get theirs now: an answer that comes later is
            # ignored, so the counts and the files agree (idempotent: none is left after).
            self.store.close_unanswered(b.id, EXPIRED if step == "expire" else CANCELLED, self.clock())
        try:
            output, errors = self._write_files(b)
        except Exception as exc:
            log.warning("batch_files_not_written", batch_id=b.id, error=repr(exc))
            return
        status = {"finalize": "completed", "expire": "expired", "cancel": "cancelled"}[step]
        done = self.store.move(b.id, status, self.clock(), output_file_id=output, error_file_id=errors)  # type: ignore[arg-type]
        log.info("batch_finished", batch_id=b.id, status=done.status, output_file_id=output, error_file_id=errors,
                 completed=done.request_counts.completed, failed=done.request_counts.failed)

    def _write_files(self, b: BatchRecord) -> tuple[str | None, str | None]:
        """Write the output and error files (each only if it has a line), in input order;
        their ids."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            counts = {"output": 0, "error": 0}
            for line, custom_id, state, result in self.store.results(b.id):
                entry: dict[str, Any] = {"id": request_id(b.id, line), "custom_id": custom_id}
                # (A line kept as done before refused lines had a state of their own is
                # judged by its status too.)
                ok = state == "done" and result is not None and answered_ok(result)
                if state in ANSWERED:
                    # A refused request (e.g. past the model's context) keeps the answer as
                    # OpenAI writes it, and names its line and reason as every bad line does.
                    entry.update(response=result, error=None if ok else refusal(result, line))
                else:
                    entry.update(response=None, error={**(result or {}), "line": line})
                kind = "output" if ok else "error"
                (out if ok else err).write(json.dumps(entry).encode() + b"\n")
                counts[kind] += 1
            output = self._put_file(b, out, "output", counts["output"]) if counts["output"] else None
            errors = self._put_file(b, err, "error", counts["error"]) if counts["error"] else None
        return output, errors

    def _put_file(self, b: BatchRecord, f: Any, kind: Literal["output", "error"], lines: int) -> str:
        file_id = result_file_id(b.id, kind)
        key = f"{self.files_prefix}{b.tenant}/{file_id}"
        size = f.tell()
        f.seek(0)
        self._s3().upload_fileobj(f, self.bucket, key)
        name = f"{b.id}_{kind}.jsonl"
        try:
            self.files.add(NewFile(id=file_id, tenant=b.tenant, filename=name, purpose="batch_output", bytes=size,
                                   lines=lines, key=key), self.clock())
        except FileExists:  # written by a finalization that did not get to the end
            pass
        return file_id
