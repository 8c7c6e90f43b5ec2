"""The Batches API's state (warm_pool.batch.store), on SQLite and PostgreSQL: lines checked
at validation (refused ones failed from the start), leased to activators and taken
again when a lease ends unanswered, each result kept once, counts and results in input
order, cancel, and a batch only its tenant sees."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.warm_pool.conftest import StateDb
from thaw.batch_lines import check_lines
from thaw.wire import BatchEndpoint, NewBatch
from warm_pool.batch.store import MAX_LINE_FAILURES, BatchStore

CHAT: BatchEndpoint = "/v1/chat/completions"
FILE = "file-0123456789abcdef"


@pytest.fixture
def store(state_db: StateDb) -> Iterator[BatchStore]:
    db = state_db()
    s = BatchStore(db)
    try:
        yield s
    finally:
        db.close()


def lines(*ids: str, bad: int = 0) -> list[bytes]:
    out = [json.dumps({"custom_id": i, "method": "POST", "url": CHAT,
                       "body": {"model": "thaw-demo", "messages": [{"role": "user", "content": i}]}}).encode()
           for i in ids]
    return out + [b"not json"] * bad


def started(store: BatchStore, batch_id: str = "batch_1", tenant: str = "acme", at: float = 100.0,
            ids: tuple[str, ...] = ("a", "b", "c"), bad: int = 1) -> None:
    store.create(NewBatch(tenant=tenant, input_file_id=FILE, endpoint=CHAT), batch_id, at)
    store.validated(batch_id, check_lines(lines(*ids, bad=bad), CHAT, {"thaw-demo": "demo"}.get), at + 1)


def test_validated_lines_run_and_refused_ones_are_failed(store: BatchStore) -> None:
    made = store.create(NewBatch(tenant="acme", input_file_id=FILE, endpoint=CHAT, metadata={"job": "eval"}),
                        "batch_1", 100.0)
    assert made.status == "validating" and made.expires_at == 100.0 + 24 * 3600
    store.validated("batch_1", check_lines(lines("a", "b", "c", bad=1), CHAT, {"thaw-demo": "demo"}.get), 101.0)
    b = store.get("acme", "batch_1")
    assert b is not None and b.status == "in_progress" and b.in_progress_at == 101.0
    assert b.metadata == {"job": "eval"}
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (4, 0, 1)
    assert [(line, state, r and r["code"]) for line, _, state, r in store.results("batch_1")] == [
        (4, "failed", "invalid_json_line")]
    assert store.get("other", "batch_1") is None and store.cancel("other", "batch_1", 102.0) is None
    assert store.pending_models() == {"demo": 3}


def test_a_file_that_is_not_jsonl_fails_the_batch(store: BatchStore) -> None:
    store.create(NewBatch(tenant="acme", input_file_id=FILE, endpoint=CHAT), "batch_1", 100.0)
    b = store.validated("batch_1", check_lines([b"nope", b"nope"], CHAT, lambda name: None), 101.0)
    assert b.status == "failed" and b.failed_at == 101.0
    assert b.errors[0].code == "invalid_file" and "not JSONL" in b.errors[0].message
    assert store.lease("a1", ["demo"], 10, 102.0, 30) == []


def test_leases_end_and_each_result_is_kept_once(store: BatchStore) -> None:
    started(store)
    first = store.lease("a1", ["demo"], 2, 110.0, lease_s=30)
    assert [(x.line, x.custom_id, x.endpoint) for x in first] == [(1, "a", CHAT), (2, "b", CHAT)]
    assert first[0].body["messages"][0]["content"] == "a" and first[0].lease_until == 140.0
    assert [x.line for x in store.lease("a2", ["demo"], 5, 111.0, 30)] == [3]
    assert store.lease("a2", ["other-model"], 5, 111.0, 30) == []
    assert store.unfinished("batch_1", 112.0) == (0, 3)
    assert store.finish("batch_1", 1, response={"status_code": 200, "body": {"x": 1}}, at=120.0)
    # a1's lease on line 2 ends unanswered: a3 takes it; then both answer, once counted.
    assert [x.line for x in store.lease("a3", ["demo"], 5, 141.0, 30)] == [2]
    assert store.finish("batch_1", 2, response={"status_code": 200, "body": {"x": 2}}, at=142.0)
    assert not store.finish("batch_1", 2, response={"status_code": 200, "body": {"x": "late"}}, at=143.0)
    # a2 gives line 3 back (cut for online traffic): pending at once.
    store.release("batch_1", 3, "a2")
    assert [x.line for x in store.lease("a1", ["demo"], 5, 144.0, 30)] == [3]
    assert store.finish("batch_1", 3, error={"code": "context_length_exceeded", "message": "too long"}, at=145.0)
    assert store.unfinished("batch_1", 146.0) == (0, 0)
    b = store.get("acme", "batch_1")
    assert b is not None and (b.request_counts.completed, b.request_counts.failed) == (2, 2)
    assert [(line, cid, state) for line, cid, state, _ in store.results("batch_1")] == [
        (1, "a", "done"), (2, "b", "done"), (3, "c", "failed"), (4, None, "failed")]
    assert next(store.results("batch_1"))[3] == {"status_code": 200, "body": {"x": 1}}
    assert store.pending_models() == {}


def test_a_running_lines_lease_is_renewed_by_its_owner_only(store: BatchStore) -> None:
    started(store, ids=("a", "b"), bad=0)
    assert [x.line for x in store.lease("a1", ["demo"], 5, 100.0, lease_s=30)] == [1, 2]
    # a1 renews line 1 at 120 (until 150); line 2 it no longer runs. a2's renewal of
    # line 1 changes nothing: not its lease.
    assert store.lease("a1", [], 0, 120.0, lease_s=30, renew=[("batch_1", 1)]) == []
    assert store.lease("a2", [], 0, 125.0, lease_s=60, renew=[("batch_1", 2)]) == []
    assert [x.line for x in store.lease("a3", ["demo"], 5, 131.0, lease_s=30)] == [2]
    assert store.lease("a3", ["demo"], 5, 149.0, lease_s=30) == []
    assert [x.line for x in store.lease("a3", ["demo"], 5, 151.0, lease_s=30)] == [1]


def test_the_kept_answer_sent_again_is_still_the_kept_one(store: BatchStore) -> None:
    started(store, ids=("a",), bad=0)
    store.lease("a1", ["demo"], 1, 110.0, 30)
    first = {"status_code": 200, "request_id": "run-1", "body": {}}
    assert store.finish("batch_1", 1, response=first, at=111.0)
    # Its reply was lost and it is sent again: the same run, the kept one (billed once).
    assert store.finish("batch_1", 1, response=first, at=112.0)
    # Another run's answer for the line is not.
    assert not store.finish("batch_1", 1, response={**first, "request_id": "run-2"}, at=113.0)


def test_a_line_whose_runs_keep_failing_is_answered_with_an_error(store: BatchStore) -> None:
    started(store, ids=("a",), bad=0)
    for i in range(MAX_LINE_FAILURES - 1):
        [leased] = store.lease("a1", ["demo"], 5, 110.0 + i, 30)
        store.release("batch_1", leased.line, "a1", failure="UpstreamError: the replica answered 500", at=111.0 + i)
    # Cut for online traffic: no failure, however often.
    for i in range(5):
        store.lease("a1", ["demo"], 5, 120.0 + i, 30)
        store.release("batch_1", 1, "a1")
    [leased] = store.lease("a1", ["demo"], 5, 130.0, 30)
    store.release("batch_1", 1, "a1", failure="UpstreamClosed: dropped", at=131.0)
    assert store.lease("a1", ["demo"], 5, 132.0, 30) == [] and store.unfinished("batch_1", 132.0) == (0, 0)
    [(line, cid, state, result)] = list(store.results("batch_1"))
    assert (line, cid, state, result["code"]) == (1, "a", "failed", "server_error")
    assert f"failed {MAX_LINE_FAILURES} times" in result["message"] and "UpstreamClosed" in result["message"]


def test_cancel_stops_the_lines_and_an_ended_batch_stays_as_it_is(store: BatchStore) -> None:
    started(store)
    b = store.cancel("acme", "batch_1", 120.0)
    assert b is not None and b.status == "cancelling" and b.cancelling_at == 120.0
    assert store.lease("a1", ["demo"], 5, 121.0, 30) == []
    done = store.move("batch_1", "cancelled", 122.0)
    assert done.status == "cancelled" and done.cancelled_at == 122.0
    again = store.cancel("acme", "batch_1", 123.0)
    assert again is not None and again.status == "cancelled"


def test_a_tenants_batches_newest_first_in_pages(store: BatchStore) -> None:
    for i in range(5):
        store.create(NewBatch(tenant="acme", input_file_id=FILE, endpoint=CHAT), f"batch_{i}", 100.0 + i)
    store.create(NewBatch(tenant="other", input_file_id=FILE, endpoint=CHAT), "batch_x", 103.5)
    page = store.page("acme", limit=2)
    assert [b.id for b in page.data] == ["batch_4", "batch_3"] and page.has_more
    rest = store.page("acme", after="batch_3", limit=10)
    assert [b.id for b in rest.data] == ["batch_2", "batch_1", "batch_0"] and not rest.has_more
    assert [b.id for b in store.in_status("validating")][:2] == ["batch_0", "batch_1"]
