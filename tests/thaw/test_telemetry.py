"""W3C trace context, the sampling decision, and spans made after the fact."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from thaw.config import TelemetryConfig
from thaw.telemetry import (
    TraceContext,
    Tracing,
    parse_traceparent,
    ratio_keeps,
    start_trace,
    tracing_from,
)


def test_a_traceparent_round_trips_and_a_bad_one_starts_a_new_trace() -> None:
    ctx = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert ctx.traceparent() == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(ctx.traceparent()) == ctx
    assert parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") == TraceContext(
        ctx.trace_id, ctx.span_id, False)
    for bad in (None, "", "garbage", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"):
        assert parse_traceparent(bad) is None, bad


def test_a_child_is_in_the_same_trace_with_its_own_id() -> None:
    parent = TraceContext(7, 8, False)
    child = parent.child()
    assert (child.trace_id, child.sampled) == (7, False) and child.span_id != 8
    assert child.kept().sampled


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.25, 1.0])
def test_the_ratio_keeps_its_share_of_new_traces(ratio: float) -> None:
    random.seed(ratio)
    kept = sum(start_trace(None, ratio).sampled for _ in range(20_000))
    assert abs(kept / 20_000 - ratio) < 0.01


def test_a_callers_decision_is_kept_and_ours_is_the_same_for_the_same_id() -> None:
    sampled, unsampled = TraceContext(123, 1, True), TraceContext(1 << 60, 1, False)
    assert start_trace(sampled, 0.0).sampled and start_trace(sampled, 0.0).trace_id == 123
    assert not start_trace(unsampled, 0.0).sampled
    # Every service decides alike from the id alone.
    assert all(ratio_keeps(t, 0.5) == ((t & ((1 << 56) - 1)) < (1 << 55)) for t in (0, 1 << 55, (1 << 56) - 1, 42))


def test_no_endpoint_no_tracing() -> None:
    assert tracing_from(TelemetryConfig(), "x") is None


def test_spans_made_after_the_fact_keep_the_ids_sent_downstream() -> None:
    exporter = InMemorySpanExporter()
    t = Tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"), "svc", exporter=exporter)
    root = start_trace(None, 1.0)
    child = root.child()
    t.span("chat m", root, None, 100.0, 103.0, kind="server", attrs={"gen_ai.request.model": "m"})
    t.span("thaw.queued", child, root.span_id, 100.0, 101.5, error="model_unavailable")
    remote = TraceContext(99, 5, True)
    t.span("thaw.assign m", remote.child(), remote.span_id, 100.2, 100.4)
    t.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    r, q, a = spans["chat m"], spans["thaw.queued"], spans["thaw.assign m"]
    assert (r.context.trace_id, r.context.span_id, r.parent) == (root.trace_id, root.span_id, None)
    assert r.start_time == 100_000_000_000 and r.end_time == 103_000_000_000
    assert r.resource.attributes["service.name"] == "svc" and r.attributes["gen_ai.request.model"] == "m"
    assert (q.context.trace_id, q.context.span_id, q.parent.span_id) == (root.trace_id, child.span_id, root.span_id)
    assert not q.status.is_ok and q.attributes["error.type"] == "model_unavailable"
    assert (a.context.trace_id, a.parent.span_id) == (99, 5)
    t.close()
