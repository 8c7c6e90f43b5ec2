"""The activator's spans, as an OTLP collector receives them: a cold request's phases
with the GenAI conventions' attributes, the context it sends to its replica and with
its demand signal, hot requests kept by the ratio or the caller's decision, failures
always."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from activator.app import create_app
from tests.activator.fake_engine import FakeEngine, serve, serve_app
from tests.activator.support import KEY, make_config, replica, served_in_this_loop, table
from tests.otlp_receiver import Received, otlp_receiver
from tests.waiting import until
from thaw.telemetry import TraceContext, parse_traceparent

CHAT = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
AUTH = {"Authorization": f"Bearer {KEY}"}
PHASES = ["thaw.queued", "thaw.instance_acquired", "thaw.snapshot_restored", "thaw.weights_loaded",
          "thaw.engine_ready", "thaw.first_token"]


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[FakeEngine, str]]:
    e = FakeEngine("traced")
    with serve(e) as url:
        yield e, url


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Received]]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def controller() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A controller that takes demand signals (kept) and answers nothing else."""
    demands: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/v1/demand")
    async def demand(request: Request) -> Response:
        demands.append(await request.json())
        return Response('{"accepted": 1, "unknown": []}', status_code=202, media_type="application/json")

    with serve_app(app) as url:
        yield url, demands


@pytest.fixture
async def activator(tmp_path: Path, receiver: tuple[str, Received],
                    controller: tuple[str, list[dict[str, Any]]]) -> AsyncIterator[tuple[Any, str]]:
    cfg = make_config(tmp_path)
    cfg = cfg.model_copy(update={"telemetry": cfg.telemetry.model_copy(update={
        "otlp_endpoint": receiver[0], "sample_ratio": 0.0})})
    app = create_app(cfg, controller[0], activator_id="traced")
    async with served_in_this_loop(app) as base:
        yield app, base


async def flushed(app: Any) -> None:
    await asyncio.to_thread(app.state.service.tracing.flush)


async def test_a_cold_request_is_one_trace_with_its_phases_and_the_conventions_attributes(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str], receiver: tuple[str, Received],
        controller: tuple[str, list[dict[str, Any]]]) -> None:
    app, base = activator
    eng, url = engine
    got = receiver[1]
    routes = app.state.routes
    routes.apply(table(1, [], loading=1))
    async with httpx.AsyncClient(timeout=30) as c:
        sent = asyncio.ensure_future(c.post(f"{base}/v1/chat/completions", json=CHAT, headers=AUTH))
        await until("the request queued", lambda: routes.status("demo").cold_queue == 1, 10)
        t = routes.clock()
        ready = replica(url, assignment="demo-3")
        ready["phases"] = {"assigned": t + 0.01, "snapshot_restored": t + 0.02, "weights_loaded": t + 0.05,
                           "engine_ready": t + 0.08}
        ready["load"] = {"tier": "disk", "seconds": 0.03, "bytes": 123456}
        await asyncio.sleep(0.1)  # not a poll: the cold start takes this long
        routes.apply(table(2, [ready]))
        r = await sent
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    await flushed(app)
    (root,) = await until("the request's span", lambda: got.roots("thaw.request_id", rid), 10)
    assert root.name == "chat thaw-demo" and root.parent_id == "" and root.service == "thaw-activator"
    a = root.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"], a["gen_ai.usage.input_tokens"],
            a["gen_ai.usage.output_tokens"], a["gen_ai.response.finish_reasons"]) == (
        "chat", "thaw-demo", 3, 5, "length")
    assert (a["thaw.cold_start"], a["thaw.tier"], a["thaw.tenant"], a["http.response.status_code"]) == (
        True, "disk", "all", 200)
    spans = {s.name: s for s in got.trace(root.trace_id) if s.parent_id == root.span_id}
    assert sorted(spans) == sorted(PHASES)
    starts = [spans[p].start_ns for p in PHASES]
    assert starts == sorted(starts) and spans["thaw.queued"].start_ns == root.start_ns
    assert spans["thaw.first_token"].end_ns <= root.end_ns
    weights = spans["thaw.weights_loaded"].attributes
    assert (weights["thaw.load.tier"], weights["thaw.load.bytes"], weights["thaw.load.swap"]) == ("disk", 123456, False)
    # The context went on: to the replica, and with the demand signal (kept: a cold start).
    sent_ctx = parse_traceparent(next(q for q in eng.requests if q["request_id"] == rid)["traceparent"])
    assert sent_ctx == TraceContext(int(root.trace_id, 16), int(root.span_id, 16), True)
    demanded = [d["traces"]["demo"] for d in controller[1] if "demo" in d.get("traces", {})]
    assert sent_ctx.traceparent() in demanded


async def test_hot_requests_are_kept_by_the_ratio_or_the_callers_decision_and_failures_always(
        activator: tuple[Any, str], engine: tuple[FakeEngine, str], receiver: tuple[str, Received]) -> None:
    app, base = activator
    _, url = engine
    got = receiver[1]
    app.state.routes.apply(table(1, [replica(url)]))
    caller = TraceContext(0xABCDEF, 0x1234, True)
    async with httpx.AsyncClient(timeout=30) as c:
        dropped = await c.post(f"{base}/v1/chat/completions", json=CHAT, headers=AUTH)
        kept = await c.post(f"{base}/v1/chat/completions", json=CHAT,
                            headers={**AUTH, "traceparent": caller.traceparent()})
        refused = await c.post(f"{base}/v1/chat/completions", json={**CHAT, "model": "nothing"}, headers=AUTH)
    assert (dropped.status_code, kept.status_code, refused.status_code) == (200, 200, 404)
    await flushed(app)
    (mine,) = await until("the caller's request", lambda: got.roots("thaw.request_id", kept.headers["x-request-id"]), 10)
    assert (mine.trace_id, mine.parent_id) == (f"{caller.trace_id:032x}", f"{caller.span_id:016x}")
    assert [s.name for s in got.trace(mine.trace_id) if s.parent_id == mine.span_id] == ["thaw.first_token"]
    (failed,) = got.roots("thaw.request_id", refused.headers["x-request-id"])
    assert failed.error and failed.attributes["error.type"] == "model_not_found"
    # Exported in order by one processor: had the unsampled one been kept, it was sent before these.
    assert got.roots("thaw.request_id", dropped.headers["x-request-id"]) == []
