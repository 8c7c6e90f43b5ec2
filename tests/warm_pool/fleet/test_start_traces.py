"""The controller's spans of a start a traced request waits for, and the context its
control call carries to the worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.activator.fake_engine import serve_app
from thaw.config import TelemetryConfig
from thaw.telemetry import TraceContext, Tracing, parse_traceparent
from thaw.wire import AssignRequest, WorkerState, WorkerStatus
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.fleet.start_traces import CONTROL_TRACE, KEPT_S, StartTraces

WAITING = TraceContext(0x5EED, 0x77, True)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def traced() -> Iterator[tuple[StartTraces, InMemorySpanExporter, Clock]]:
    exporter, clock = InMemorySpanExporter(), Clock()
    tracing = Tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"), "thaw-controller", exporter=exporter)
    yield StartTraces(tracing, clock), exporter, clock
    tracing.close()


def test_a_start_joins_the_trace_of_the_first_request_waiting_for_it(
        traced: tuple[StartTraces, InMemorySpanExporter, Clock]) -> None:
    traces, exporter, clock = traced
    traces.demanded("m", WAITING.traceparent())
    traces.demanded("m", TraceContext(1, 2, True).traceparent())  # a later one: the first is kept
    clock.t += 0.5  # the decision
    with traces.starting("m", "/assign", {"thaw.worker_id": "w1"}):
        sent = parse_traceparent(CONTROL_TRACE.get())
        clock.t += 0.2  # the call
    assert CONTROL_TRACE.get() is None
    assert traces.tracing is not None
    traces.tracing.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assign, call = spans["thaw.assign m"], spans["POST /assign"]
    assert (assign.context.trace_id, assign.parent.span_id) == (WAITING.trace_id, WAITING.span_id)
    assert assign.start_time == 1000 * 10**9 and assign.end_time == int(1000.7 * 10**9)
    assert assign.attributes["thaw.worker_id"] == "w1" and assign.attributes["gen_ai.request.model"] == "m"
    assert call.parent.span_id == assign.context.span_id and call.kind.name == "CLIENT"
    assert sent == TraceContext(WAITING.trace_id, call.context.span_id, True)
    # Taken: the next start of the model is in no trace.
    with traces.starting("m", "/assign", {}):
        assert CONTROL_TRACE.get() is None


def test_a_failed_call_is_an_error_and_an_old_or_malformed_demand_is_forgotten(
        traced: tuple[StartTraces, InMemorySpanExporter, Clock]) -> None:
    traces, exporter, clock = traced
    traces.demanded("m", WAITING.traceparent())
    with traces.starting("m", "/engines", {}) as failed:
        failed.append("control_failed")
    traces.demanded("old", WAITING.traceparent())
    traces.demanded("bad", "not a traceparent")
    clock.t += KEPT_S + 1
    for model in ("old", "bad"):
        with traces.starting(model, "/assign", {}):
            assert CONTROL_TRACE.get() is None
    assert traces.tracing is not None
    traces.tracing.flush()
    (assign, call) = sorted(exporter.get_finished_spans(), key=lambda s: s.name, reverse=True)
    assert not assign.status.is_ok and assign.attributes["error.type"] == "control_failed" and not call.status.is_ok


def test_without_tracing_nothing_is_kept() -> None:
    traces = StartTraces(None, Clock())
    traces.demanded("m", WAITING.traceparent())
    with traces.starting("m", "/assign", {}):
        assert CONTROL_TRACE.get() is None


async def test_the_control_call_carries_the_context_to_the_worker(
        traced: tuple[StartTraces, InMemorySpanExporter, Clock]) -> None:
    traces, _, _ = traced
    seen: list[str | None] = []
    app = FastAPI()

    @app.post("/assign")
    async def assign(request: Request) -> Response:
        seen.append(request.headers.get("traceparent"))
        status = WorkerStatus(worker_id="w1", instance_id="i-1", shape="cpu", state=WorkerState.LOADING,
                              control_url="http://127.0.0.1:9", started_at=0, state_since=0)
        return Response(status.model_dump_json(), media_type="application/json")

    control = HttpWorkerControl("token")
    req = AssignRequest(assignment_id="a1", model="m", uri="s3://thaw/models/m", served_model_name="m", max_model_len=64)
    traces.demanded("m", WAITING.traceparent())
    with serve_app(app) as url:
        await control.assign(url, req)  # no start waits on it: no context
        with traces.starting("m", "/assign", {}):
            await control.assign(url, req)
            expected = CONTROL_TRACE.get()
    await control.close()
    assert seen == [None, expected] and expected is not None
