"""The worker's spans of a traced load, from the agent's facts."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from thaw.config import TelemetryConfig
from thaw.telemetry import TraceContext, Tracing
from thaw.wire import LoadView
from worker.load_trace import LoadTraces
from worker.state import Assignment, Facts, SnapshotFacts

CALL = TraceContext(0xFEED, 0x42, True)


def traces() -> tuple[LoadTraces, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"), "thaw-worker", exporter=exporter)
    return LoadTraces(tracing, "w1"), exporter


def test_a_traced_load_is_a_span_under_the_call_with_a_child_per_step() -> None:
    t, exporter = traces()
    a = Assignment("a1", "m", "s3://thaw/models/m", "m", assigned_at=100.0)
    facts = Facts(assignment=a, snapshot_restored_at=100.5, snapshot=SnapshotFacts("restored", bytes=2048),
                  launched_at=100.6, weights_loaded_at=102.0, engine_ready_at=104.0,
                  load=LoadView(tier="s3", seconds=1.2, bytes=10**9))
    t.assigned("a1", CALL.traceparent())
    t.assigned("other", None)
    t.ended(a, facts, now=104.1)
    t.ended(a, facts, now=104.2)  # once
    assert t.tracing is not None
    t.tracing.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["thaw.engine_start", "thaw.load m", "thaw.snapshot_restore", "thaw.weights_load"]
    load = spans["thaw.load m"]
    assert (load.context.trace_id, load.parent.span_id) == (CALL.trace_id, CALL.span_id)
    assert (load.start_time, load.end_time) == (100 * 10**9, 104 * 10**9)
    assert (load.attributes["thaw.load.tier"], load.attributes["thaw.load.bytes"]) == ("s3", 10**9)
    assert all(s.parent.span_id == load.context.span_id for n, s in spans.items() if n != "thaw.load m")
    w = spans["thaw.weights_load"]
    assert (w.start_time, w.end_time, w.attributes["thaw.load.seconds"]) == (int(100.6 * 10**9), 102 * 10**9, 1.2)
    assert spans["thaw.snapshot_restore"].attributes["thaw.snapshot.bytes"] == 2048
    t.tracing.close()


def test_a_failed_load_is_an_error_and_an_untraced_one_makes_nothing() -> None:
    t, exporter = traces()
    a = Assignment("a2", "m", "s3://thaw/models/m", "m", assigned_at=100.0)
    t.assigned("a2", CALL.traceparent())
    t.ended(a, Facts(assignment=a, launched_at=100.2), now=130.0, error="store")
    b = Assignment("b", "m", "s3://thaw/models/m", "m", assigned_at=100.0)
    t.ended(b, Facts(assignment=b), now=101.0)
    assert t.tracing is not None
    t.tracing.flush()
    (load,) = [s for s in exporter.get_finished_spans() if s.name == "thaw.load m"]
    assert not load.status.is_ok and load.attributes["error.type"] == "store" and load.end_time == 130 * 10**9
    t.tracing.close()
