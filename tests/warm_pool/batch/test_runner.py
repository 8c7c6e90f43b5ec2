"""The leader's batch work (warm_pool.batch.runner) with the store (SeaweedFS) and the
state database, activators played by leases and answers: a batch is validated from its
input file, finalized into output and error files in input order once every line is
answered, expired with its unanswered lines named, and cancelled once nothing runs.
Finalizing twice writes the same files."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.conftest import BUCKET
from thaw.objstore import S3Endpoint
from thaw.wire import BatchEndpoint, BatchRecord, NewBatch, NewFile
from warm_pool.batch.files import FileIndex
from warm_pool.batch.runner import BatchRunner, batch_step
from warm_pool.batch.store import BatchStore
from warm_pool.db import Db
from warm_pool.metrics import PoolMetrics

CHAT: BatchEndpoint = "/v1/chat/completions"
MODELS = {"thaw-demo": "demo"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(custom_id: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "thaw-demo", "messages": [{"role": "user", "content": custom_id}]}}


@pytest.fixture
def world(s3: S3Endpoint, s3_prefix: str) -> dict[str, Any]:
    db = Db.sqlite(None)
    clock = Clock()
    files, store = FileIndex(db), BatchStore(db)
    prefix = s3_prefix.split("/", 3)[3] + "/files/"
    registry = CollectorRegistry()
    metrics = PoolMetrics(registry)
    runner = BatchRunner(store, files, s3.client, BUCKET, prefix, resolver=lambda tenant: MODELS.get, clock=clock,
                         metrics=metrics)
    return {"files": files, "store": store, "runner": runner, "clock": clock, "s3": s3.client(), "prefix": prefix,
            "registry": registry}


def upload(w: dict[str, Any], lines: list[bytes], file_id: str = "file-input0001") -> str:
    key = f"{w['prefix']}acme/{file_id}"
    w["s3"].put_object(Bucket=BUCKET, Key=key, Body=b"\n".join(lines) + b"\n")
    w["files"].add(NewFile(id=file_id, tenant="acme", filename="in.jsonl", purpose="batch", bytes=1,
                           lines=len(lines), key=key), w["clock"]())
    return file_id


def read_file(w: dict[str, Any], file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    record = w["files"].get("acme", file_id)
    assert record is not None and record.purpose == "batch_output"
    body = w["s3"].get_object(Bucket=BUCKET, Key=record.key)["Body"].read()
    return [json.loads(x) for x in body.splitlines()]


async def started(w: dict[str, Any], n: int = 3, bad: int = 1, file_id: str = "file-input0001") -> BatchRecord:
    lines = [json.dumps(request(f"r{i}")).encode() for i in range(1, n + 1)] + [b"{oops"] * bad
    fid = upload(w, lines, file_id)
    batch = w["store"].create(NewBatch(tenant="acme", input_file_id=fid, endpoint=CHAT), f"batch_{file_id[-4:]}",
                              w["clock"]())
    await w["runner"].tick()
    got = w["store"].get("acme", batch.id)
    assert got is not None and got.status == "in_progress", got
    return got


def ok(i: int) -> dict[str, Any]:
    return {"status_code": 200, "request_id": f"req-{i}", "body": {"choices": [{"message": {"content": f"a{i}"}}]}}


def test_what_a_running_batch_needs() -> None:
    b = BatchRecord(id="b", tenant="t", input_file_id="file-00000000", endpoint=CHAT, completion_window="24h",
                    status="in_progress", created_at=0, expires_at=100)
    assert batch_step(b, pending=2, leased=1, now=50) is None
    assert batch_step(b, pending=0, leased=0, now=50) == "finalize"
    assert batch_step(b, pending=1, leased=0, now=100) == "expire"
    assert batch_step(b, pending=0, leased=0, now=100) == "finalize"  # all answered: completed, not expired
    cancelling = b.model_copy(update={"status": "cancelling"})
    assert batch_step(cancelling, pending=3, leased=1, now=50) is None
    assert batch_step(cancelling, pending=3, leased=0, now=50) == "cancel"
    assert batch_step(b.model_copy(update={"status": "finalizing"}), 0, 0, 50) == "finalize"
    assert batch_step(b.model_copy(update={"status": "completed"}), 0, 0, 50) is None


async def test_a_batch_is_validated_answered_and_finalized_in_input_order(world: dict[str, Any]) -> None:
    w, store = world, world["store"]
    batch = await started(w)
    assert (batch.request_counts.total, batch.request_counts.failed) == (4, 1)
    registry = w["registry"]
    assert registry.get_sample_value("thaw_batches", {"status": "in_progress"}) == 1
    assert registry.get_sample_value("thaw_batch_lines", {"model": "demo", "state": "pending"}) == 3
    assert registry.get_sample_value("thaw_batch_lines", {"model": "-", "state": "failed"}) == 1
    leased = store.lease("act-1", ["demo"], 10, w["clock"](), 60)
    assert [x.custom_id for x in leased] == ["r1", "r2", "r3"] and leased[0].model == "demo"
    # Answered out of order; r2 the engine refused.
    store.finish(batch.id, 3, response=ok(3), at=w["clock"]())
    store.finish(batch.id, 2, response={"status_code": 400, "request_id": "req-2",
                                        "body": {"error": {"message": "too long", "code": "context_length_exceeded"}}},
                 at=w["clock"]())
    await w["runner"].tick()
    assert store.get("acme", batch.id).status == "in_progress"  # type: ignore[union-attr]
    # What thaw pool status shows of it: the batch running, its lines by state.
    assert w["runner"].census == ({"in_progress": 1}, {("demo", "leased"): 1, ("demo", "done"): 1,
                                                       ("demo", "refused"): 1, ("-", "failed"): 1})
    store.finish(batch.id, 1, response=ok(1), at=w["clock"]())
    await w["runner"].tick()
    done = store.get("acme", batch.id)
    assert done is not None and done.status == "completed" and done.finalizing_at and done.completed_at
    assert registry.get_sample_value("thaw_batches", {"status": "completed"}) == 1
    assert registry.get_sample_value("thaw_batches", {"status": "in_progress"}) is None
    assert registry.get_sample_value("thaw_batch_lines", {"model": "demo", "state": "pending"}) is None
    # r2, answered with an error status, counts as failed: the counts agree with the files.
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 2, 2)
    output = read_file(w, done.output_file_id)
    assert [(x["custom_id"], x["response"]["body"]["choices"][0]["message"]["content"]) for x in output] == [
        ("r1", "a1"), ("r3", "a3")]
    assert all(x["error"] is None and x["id"].startswith("batch_req_") for x in output)
    errors = read_file(w, done.error_file_id)
    assert [(x["custom_id"], x["response"] and x["response"]["status_code"], x["error"] and x["error"]["line"])
            for x in errors] == [("r2", 400, 2), (None, None, 4)]
    assert errors[0]["error"]["code"] == "context_length_exceeded" and errors[0]["error"]["message"] == (
        "line 2: too long")
    assert errors[1]["error"]["code"] == "invalid_json_line" and "line 4" in errors[1]["error"]["message"]
    # Finalizing again (a controller that died before recording it) writes the same files.
    w["runner"]._finish(done, "finalize")
    again = store.get("acme", batch.id)
    assert again is not None and (again.output_file_id, again.error_file_id) == (done.output_file_id,
                                                                                 done.error_file_id)


async def test_a_batch_past_its_window_expires_with_its_unanswered_lines_named(world: dict[str, Any]) -> None:
    w, store = world, world["store"]
    batch = await started(w, n=3, bad=0)
    store.lease("act-1", ["demo"], 1, w["clock"](), 60)
    store.finish(batch.id, 1, response=ok(1), at=w["clock"]())
    w["clock"].now = batch.expires_at
    await w["runner"].tick()
    done = store.get("acme", batch.id)
    assert done is not None and done.status == "expired" and done.expired_at == batch.expires_at
    assert [x["custom_id"] for x in read_file(w, done.output_file_id)] == ["r1"]
    errors = read_file(w, done.error_file_id)
    assert [(x["custom_id"], x["error"]["code"], x["error"]["line"]) for x in errors] == [
        ("r2", "batch_expired", 2), ("r3", "batch_expired", 3)]
    # The counts say what the files say, and an answer after the end changes neither.
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert not store.finish(batch.id, 2, response=ok(2), at=w["clock"]())
    after = store.get("acme", batch.id)
    assert after is not None and (after.request_counts.completed, after.request_counts.failed) == (1, 2)


async def test_a_cancelled_batch_ends_once_nothing_runs(world: dict[str, Any]) -> None:
    w, store = world, world["store"]
    batch = await started(w, n=3, bad=0)
    store.lease("act-1", ["demo"], 1, w["clock"](), 60)
    store.cancel("acme", batch.id, w["clock"]())
    await w["runner"].tick()
    assert store.get("acme", batch.id).status == "cancelling"  # type: ignore[union-attr]
    store.finish(batch.id, 1, response=ok(1), at=w["clock"]())
    await w["runner"].tick()
    done = store.get("acme", batch.id)
    assert done is not None and done.status == "cancelled" and done.cancelled_at is not None
    assert [x["custom_id"] for x in read_file(w, done.output_file_id)] == ["r1"]
    assert [x["error"]["code"] for x in read_file(w, done.error_file_id)] == ["batch_cancelled"] * 2


async def test_a_file_that_is_not_jsonl_or_is_gone_fails_the_batch(world: dict[str, Any]) -> None:
    w, store = world, world["store"]
    fid = upload(w, [b"hello", b"world"])
    bad = store.create(NewBatch(tenant="acme", input_file_id=fid, endpoint=CHAT), "batch_bad", w["clock"]())
    gone = store.create(NewBatch(tenant="acme", input_file_id="file-gone0000", endpoint=CHAT), "batch_gone",
                        w["clock"]())
    await w["runner"].tick()
    b, g = store.get("acme", bad.id), store.get("acme", gone.id)
    assert b is not None and b.status == "failed" and b.errors[0].code == "invalid_file"
    assert g is not None and g.status == "failed" and g.errors[0].code == "invalid_input_file"
