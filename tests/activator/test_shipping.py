"""Usage shipping: sealed segments in a real SeaweedFS, counted once across activators,
crashes between a PUT and the watermark's commit, a store that is down."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from activator.app import create_app
from activator.ledger import Ledger
from activator.shipping import (
    CLIENT_CONFIG,
    UsageShipper,
    decode_lines,
    encode_lines,
    parse_segment_key,
    read_watermark,
    segment_key,
)
from activator.usage_store import UsageReader, merge_intervals, merge_records, read_usage
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import record, replica, table
from tests.conftest import BUCKET
from tests.waiting import until
from thaw.config import hash_api_key, parse_config
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from thaw.s3uri import parse_s3_uri

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
ACME, GLOBEX = "key-acme", "key-globex"
CHAT = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}]}


# -- pure parts ----------------------------------------------------------------------------


def test_segment_names_sort_in_row_order_and_parse_back() -> None:
    keys = [segment_key("usage/", "a-8000", first, last) for first, last in [(1, 9), (10, 120), (121, 1000)]]
    assert keys == sorted(keys)
    assert keys[1] == "usage/a-8000/000000000010-000000000120.jsonl.gz"
    assert parse_segment_key("usage/", keys[1]) == ("a-8000", 10, 120)
    assert parse_segment_key("usage/", "usage/a-8000/shipped.json") is None
    assert parse_segment_key("usage/", "other/a-8000/000000000010-000000000120.jsonl.gz") is None


def test_same_rows_encode_to_the_same_bytes() -> None:
    rows = [{"id": 1, "tenant": "t"}, {"id": 2, "tenant": "u"}]
    assert encode_lines(rows) == encode_lines(rows)  # a re-shipped segment is the same object
    assert decode_lines(encode_lines(rows)) == rows


def rec(activator: str, id: int, request_id: str = "r", started_at: float = 0.0) -> dict[str, Any]:
    return {"activator": activator, "id": id, "request_id": request_id, "started_at": started_at or float(id)}


@pytest.mark.parametrize("sources, expected", [
    # a segment shipped twice: once each
    ([[rec("a", 1), rec("a", 2)], [rec("a", 1), rec("a", 2)]], [("a", 1), ("a", 2)]),
    # overlapping segments after a crash between PUT and commit: 1-2 then 1-3
    ([[rec("a", 1), rec("a", 2)], [rec("a", 1), rec("a", 2), rec("a", 3)]], [("a", 1), ("a", 2), ("a", 3)]),
    # the same row id in two activators: two records
    ([[rec("a", 1)], [rec("b", 1)]], [("a", 1), ("b", 1)]),
    # the same client-supplied request id twice in one activator: two records
    ([[rec("a", 1, "dup"), rec("a", 2, "dup")]], [("a", 1), ("a", 2)]),
])
def test_records_are_counted_once_per_activator_and_row(
    sources: list[list[dict[str, Any]]], expected: list[tuple[str, int]]
) -> None:
    assert [(r["activator"], r["id"]) for r in merge_records(sources)] == expected


def test_replica_intervals_merge_across_activators() -> None:
    a = [{"replica": "demo-1", "model": "demo", "gpus": 1, "started_at": 10.0, "ended_at": None}]  # killed
    b = [{"replica": "demo-1", "model": "demo", "gpus": 1, "started_at": 12.0, "ended_at": 50.0},
         {"replica": "demo-2", "model": "demo", "gpus": 2, "started_at": 20.0, "ended_at": None}]
    # demo-1: earliest start (a's 10), the end b saw (50); demo-2 still up.
    assert [(iv["replica"], iv["started_at"], iv["ended_at"]) for iv in merge_intervals([a, b])] == [
        ("demo-1", 10.0, 50.0), ("demo-2", 20.0, None)]


# -- against the store ----------------------------------------------------------------------


@pytest.fixture
def prefix(s3_prefix: str) -> str:
    return parse_s3_uri(s3_prefix)[1] + "/usage/"


async def write(path: Path, records: list[Any]) -> None:
    ledger = Ledger(path)
    try:
        for r in records:
            await ledger.append(r)
    finally:
        ledger.close()


def shipper(path: Path, activator: str, s3: S3Endpoint, prefix: str, **kw: Any) -> UsageShipper:
    return UsageShipper(path, activator, s3.client(), BUCKET, prefix=prefix, **kw)


def listed(s3: S3Endpoint, prefix: str) -> list[str]:
    page = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for o in page.get("Contents", []))


@pytest.mark.integration
async def test_ship_and_read_back(tmp_path: Path, s3: S3Endpoint, prefix: str) -> None:
    path = tmp_path / "a.db"
    await write(path, [record(i, "acme" if i % 2 else "globex") for i in range(1, 6)])
    sh = shipper(path, "a", s3, prefix, max_records=3, clock=lambda: 5000.0)
    assert await sh.ship_once() == 5
    # 5 records at most 3 a segment: two segments, the marker, the replica intervals.
    assert listed(s3, prefix) == ["a/000000000001-000000000003.jsonl.gz", "a/000000000004-000000000005.jsonl.gz",
                                  "a/replicas.json.gz", "a/shipped.json"]
    assert await sh.ship_once() == 0  # nothing new: nothing re-shipped
    wm = read_watermark(path)
    assert wm is not None and (wm.activator, wm.last_id) == ("a", 5)

    # Everything committed before the shipper's read at 5000 is in the store; read at 5030.
    usage = read_usage(UsageReader(s3.client(), BUCKET, prefix), {}, now=5030.0)
    assert [(r["activator"], r["id"], r["request_id"]) for r in usage.records] == [
        ("a", i, f"r{i}") for i in range(1, 6)]
    assert usage.complete and usage.shipping()["activators"]["a"]["lag_s"] == 30.0
    only = read_usage(UsageReader(s3.client(), BUCKET, prefix), {}, tenant="globex", since=1002.0)
    assert [r["id"] for r in only.records] == [2, 4]


@pytest.mark.integration
async def test_a_crash_between_put_and_commit_counts_each_record_once(
    tmp_path: Path, s3: S3Endpoint, prefix: str
) -> None:
    path = tmp_path / "a.db"
    await write(path, [record(i) for i in range(1, 4)])
    first = shipper(path, "a", s3, prefix)
    batch = first.read_batch()
    first.put_segment(batch)
    first.put_segment(batch)  # shipped twice: the same object
    # ... killed before the watermark's commit; more records arrive; restarted.
    await write(path, [record(i) for i in range(4, 6)])
    assert read_watermark(path) is None
    again = shipper(path, "a", s3, prefix)
    assert await again.ship_once() == 5  # the range is decided locally: 1-5 again
    assert [k for k in listed(s3, prefix) if k.endswith(".jsonl.gz")] == [
        "a/000000000001-000000000003.jsonl.gz", "a/000000000001-000000000005.jsonl.gz"]
    usage = read_usage(UsageReader(s3.client(), BUCKET, prefix), {})
    assert [r["id"] for r in usage.records] == [1, 2, 3, 4, 5]


@pytest.mark.integration
async def test_two_activators_merge_with_the_local_tail(tmp_path: Path, s3: S3Endpoint, prefix: str) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    await write(a, [record(i, "acme") for i in range(1, 4)])
    await write(b, [record(i, "acme") for i in range(1, 3)])
    assert await shipper(a, "a", s3, prefix).ship_once() == 3
    assert await shipper(b, "b", s3, prefix).ship_once() == 2
    await write(b, [record(i, "acme") for i in range(3, 5)])  # b's tail: not shipped yet
    reader = UsageReader(s3.client(), BUCKET, prefix)

    # Seen from b's machine: a from the store, b from its ledger (shipped part counted once).
    here = read_usage(reader, {"b": b}, tenant="acme")
    assert sorted((r["activator"], r["id"]) for r in here.records) == [
        ("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("b", 3), ("b", 4)]
    lag = here.shipping()
    assert lag["activators"]["b"]["local"] is True and lag["activators"]["b"]["lag_s"] == 0.0
    assert lag["activators"]["a"]["local"] is False and lag["activators"]["a"]["through_id"] == 3
    # Seen from elsewhere: b's tail is not in the store yet, and the lag says how old b's part is.
    elsewhere = read_usage(reader, {})
    assert len(elsewhere.records) == 5
    assert elsewhere.shipping()["activators"]["b"]["through_id"] == 2


@pytest.mark.integration
async def test_the_lag_gauge_counts_from_the_last_successful_ship(tmp_path: Path, s3: S3Endpoint, prefix: str) -> None:
    from prometheus_client import CollectorRegistry

    from activator.metrics import ActivatorMetrics

    path = tmp_path / "a.db"
    await write(path, [record(1)])
    metrics = ActivatorMetrics(CollectorRegistry())
    now = [100.0]
    sh = shipper(path, "a", s3, prefix, metrics=metrics, clock=lambda: now[0])

    def lag() -> float | None:
        return metrics.registry.get_sample_value("thaw_usage_ship_lag_seconds")

    await sh.start()  # ships at once, at 100
    await until("the first shipment's watermark", lambda: read_watermark(path) is not None and sh.covered_through == 100.0,
                10)
    now[0] = 130.0
    assert lag() == 30.0  # 130 - 100
    sh.client = S3Endpoint(f"http://127.0.0.1:{free_port()}", "k", "s").client(**CLIENT_CONFIG)
    assert await sh.ship_once() is None
    now[0] = 140.0
    assert lag() == 40.0  # still from the last success at 100
    await sh.close(final_timeout_s=5)  # the final ship fails too, within its bound
    assert metrics.registry.get_sample_value("thaw_usage_ship_failures_total") == 2


def fleet_config(tmp_path: Path, data_dir: Path, s3: S3Endpoint, prefix: str) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(data_dir)
    creds = tmp_path / "store-credentials.json"
    creds.write_text(json.dumps({"access_key": s3.access_key, "secret_key": s3.secret_key}))
    data["object_store"] = {"kind": "s3", "endpoint_url": s3.endpoint_url, "region": s3.region, "bucket": BUCKET,
                            "credentials": {"source": "file", "file": str(creds)}}
    for m in data["models"]:  # models live in the store's bucket (object_store.allowed_prefixes)
        m["uri"] = f"s3://{BUCKET}/models/{m['name']}"
    data["ledger"] = {"ship_prefix": prefix, "ship_max_records": 3}
    data["tenants"] = [
        {"name": "acme", "api_key_hashes": [hash_api_key(ACME)], "allowed_models": ["*"]},
        {"name": "globex", "api_key_hashes": [hash_api_key(GLOBEX)], "allowed_models": ["*"]},
    ]
    return data


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with serve(FakeEngine("one")) as url:
        yield url


async def chat(app: Any, n: int, key: str = ACME) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        for _ in range(n):
            r = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text


async def usage_of(app: Any, key: str) -> dict[str, Any]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        r = await client.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return dict(r.json())


async def stop(app: Any) -> None:
    """Like a SIGKILL after the last commit: no final ship."""
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


@pytest.mark.integration
async def test_a_store_that_is_down_does_not_touch_serving_and_is_retried(
    tmp_path: Path, s3: S3Endpoint, prefix: str, engine: str
) -> None:
    cfg = parse_config(fleet_config(tmp_path, tmp_path / "data", s3, prefix))
    down = S3Endpoint(f"http://127.0.0.1:{free_port()}", "k", "s").client(**CLIENT_CONFIG)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="a", usage_client=down)
    try:
        app.state.routes.apply(table(1, [replica(engine)]))
        await chat(app, 2)
        sh = app.state.shipper
        assert await sh.ship_once() is None  # failed, counted, logged; nothing raised
        assert app.state.metrics.usage_ship_failures._value.get() == 1
        assert read_watermark(app.state.ledger.path) is None
        await chat(app, 1)  # still serving
        # /v1/usage answers from the local ledger and says it is incomplete.
        body = await usage_of(app, ACME)
        assert body["totals"]["requests"] == 3 and body["complete"] is False
        assert "could not be read" in body["incomplete_reason"]
        # The store is back: the next tick ships everything that waited.
        sh.client = s3.client()
        assert await sh.ship_once() == 3
        assert app.state.metrics.usage_shipped_records._value.get() == 3
        assert app.state.metrics.usage_shipped_segments._value.get() == 1
    finally:
        await stop(app)


@pytest.mark.integration
async def test_usage_endpoint_shows_only_the_callers_tenant_from_every_activator(
    tmp_path: Path, s3: S3Endpoint, prefix: str, engine: str
) -> None:
    # Another activator shipped records of both tenants.
    other = tmp_path / "other.db"
    await write(other, [record(1, "acme"), record(2, "globex"), record(3, "globex")])
    assert await shipper(other, "b", s3, prefix).ship_once() == 3
    cfg = parse_config(fleet_config(tmp_path, tmp_path / "data", s3, prefix))
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="a", usage_client=s3.client())
    try:
        app.state.routes.apply(table(1, [replica(engine)]))
        await chat(app, 2, ACME)
        await chat(app, 1, GLOBEX)
        acme = await usage_of(app, ACME)
        # 2 here (not shipped yet: the local tail) + 1 of b's.
        assert acme["complete"] is True and acme["totals"]["requests"] == 3
        assert {r["tenant"] for r in acme["data"]} == {"acme"}
        assert sorted(r["request_id"] for r in acme["data"] if r["request_id"] == "r1") == ["r1"]
        globex = await usage_of(app, GLOBEX)
        assert {r["tenant"] for r in globex["data"]} == {"globex"} and globex["totals"]["requests"] == 3
        # The lag, but not which activators (host names) exist, nor their row ids.
        assert set(globex["shipping"]) == {"lag_s"} and globex["shipping"]["lag_s"] >= 0
        assert not any("activator" in r or "id" in r for r in globex["data"])
    finally:
        await stop(app)


@pytest.mark.integration
async def test_thaw_usage_counts_every_request_once_across_a_killed_and_restarted_activator(
    tmp_path: Path, s3: S3Endpoint, prefix: str, engine: str
) -> None:
    """Activator a on one machine, b on another, one store. a ships part of its ledger,
    is killed in the middle of a ship (after the PUT, before the watermark), restarts
    with the same id and serves more; b never finishes shipping. `thaw usage` on b's
    machine counts every request once."""
    machine_a, machine_b = tmp_path / "machine-a", tmp_path / "machine-b"
    cfg_a = parse_config(fleet_config(tmp_path, machine_a, s3, prefix))
    cfg_b = fleet_config(tmp_path, machine_b, s3, prefix)
    pool = f"http://127.0.0.1:{free_port()}"

    a = create_app(cfg_a, pool, activator_id="a", usage_client=s3.client())
    a.state.routes.apply(table(1, [replica(engine)]))
    await chat(a, 4)
    assert await a.state.shipper.ship_once() == 4  # segments 1-3, 4-4
    await chat(a, 2)
    mid = a.state.shipper.read_batch()
    a.state.shipper.put_segment(mid)  # 5-6 in the store, the watermark still at 4
    await stop(a)  # SIGKILL: no final ship

    a = create_app(cfg_a, pool, activator_id="a", usage_client=s3.client())
    async with a.router.lifespan_context(a):  # starts the shipper: it ships what was left at once
        a.state.routes.apply(table(1, [replica(engine)]))
        await chat(a, 3)
    # The lifespan's end shipped the rest.
    assert read_watermark(cfg_a.ledger_path_for("a")).last_id == 9  # type: ignore[union-attr]

    b = create_app(parse_config(cfg_b), pool, activator_id="b", usage_client=s3.client())
    b.state.routes.apply(table(1, [replica(engine)]))
    await chat(b, 2, GLOBEX)
    assert await b.state.shipper.ship_once() == 2
    await chat(b, 1, GLOBEX)  # b's local tail
    await stop(b)

    config = tmp_path / "machine-b.yaml"
    config.write_text(yaml.safe_dump(cfg_b))
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "thaw.cli.main", "usage", "--format", "json",
                                                   "--config", str(config)],
                                  capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    # a: 4 + 2 + 3 requests; b: 2 + 1.
    assert answer["tenants"]["acme"]["requests"] == 9 and answer["tenants"]["globex"]["requests"] == 3
    assert len({(r["activator"], r["id"]) for r in answer["records"]}) == len(answer["records"]) == 12
    assert answer["complete"] is True
    assert answer["shipping"]["activators"]["a"]["through_id"] == 9
    assert answer["shipping"]["activators"]["b"]["local"] is True

    table_out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "thaw.cli.main", "usage",
                                                         "--config", str(config)],
                                        capture_output=True, text=True, timeout=120)
    assert table_out.returncode == 0 and "shipping lag" in table_out.stdout
