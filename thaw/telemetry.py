"""OpenTelemetry traces across the services: W3C trace context, the sampling decision, and
spans made after the fact.

A request's spans are made when it ends, from the times the services already keep (its
arrival, the worker's milestones, its first byte), not around the code as it runs: a
request that is not traced costs two random numbers and a header, and the decision to
keep one can wait until its end (a cold start and a failure are always kept, a
``telemetry.sample_ratio`` share of the rest). The ids are chosen at the start and
sent on every internal call as a W3C ``traceparent``, so the controller's and the
worker's spans of a cold start join the trace of the request that woke the model.

Exported over OTLP/HTTP (protobuf) by the SDK's batch processor, on its own thread,
when ``telemetry.otlp_endpoint`` is set; with none, :func:`tracing_from` gives None and
nothing here runs. See docs/guide/monitoring.md, "Traces".
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from thaw.config import TelemetryConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_RATIO_BITS = 1 << 56  # as OpenTelemetry's TraceIdRatioBased: the id's low 56 bits

Attrs = Mapping[str, str | bool | int | float]
Kind = Literal["server", "client", "internal"]


@dataclass(frozen=True)
class TraceContext:
    """Where a span sits: its trace, its own id, and whether the trace is kept."""

    trace_id: int
    span_id: int
    sampled: bool

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def child(self) -> TraceContext:
        """A new span in the same trace."""
        return TraceContext(self.trace_id, new_span_id(), self.sampled)

    def kept(self) -> TraceContext:
        return TraceContext(self.trace_id, self.span_id, True)


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def parse_traceparent(value: str | None) -> TraceContext | None:
    """A W3C ``traceparent`` header (version 00); None when absent or malformed, as the
    recommendation says: a bad header starts a new trace."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None:
        return None
    trace_id, span_id = int(m.group(1), 16), int(m.group(2), 16)
    if not trace_id or not span_id:
        return None
    return TraceContext(trace_id, span_id, bool(int(m.group(3), 16) & 1))


def ratio_keeps(trace_id: int, ratio: float) -> bool:
    """Whether a trace id falls in the sampled share (the same ids are kept by every
    service and every sampler that reads the id's low 56 bits)."""
    return (trace_id & (_RATIO_BITS - 1)) < ratio * _RATIO_BITS


def start_trace(parent: TraceContext | None, ratio: float) -> TraceContext:
    """The context of a request's first span here: in the caller's trace when it sent
    one (kept when the caller keeps it), else a new trace kept by ``ratio``."""
    if parent is not None:
        return TraceContext(parent.trace_id, new_span_id(), parent.sampled or ratio_keeps(parent.trace_id, ratio))
    trace_id = random.getrandbits(128) or 1
    return TraceContext(trace_id, new_span_id(), ratio_keeps(trace_id, ratio))


class _PresetIds:
    """The SDK asks this for each span's ids: the ones chosen before (and already sent
    downstream), else random ones. (An ``IdGenerator``; the SDK is imported only where
    tracing is on.)"""

    def __init__(self) -> None:
        self.next_span_id: int | None = None
        self.next_trace_id: int | None = None

    def generate_span_id(self) -> int:
        sid, self.next_span_id = self.next_span_id, None
        return sid if sid is not None else new_span_id()

    def generate_trace_id(self) -> int:
        tid, self.next_trace_id = self.next_trace_id, None
        return tid if tid is not None else random.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True


def _seconds_ns(t: float) -> int:
    return int(t * 1e9)


class Tracing:
    """Spans of one service, exported in the background."""

    def __init__(self, cfg: TelemetryConfig, service: str, *, exporter: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
        )

        self._otel = (trace, Context, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags)
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
        self.ratio = cfg.sample_ratio
        self._ids = _PresetIds()
        self.provider: TracerProvider = TracerProvider(resource=Resource.create({"service.name": service}),
                                                       id_generator=self._ids)  # type: ignore[arg-type]
        if exporter is None:
            assert cfg.otlp_endpoint is not None
            exporter = OTLPSpanExporter(endpoint=cfg.otlp_endpoint.rstrip("/") + "/v1/traces",
                                        headers=dict(cfg.otlp_headers), timeout=10)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("thaw")

    def span(self, name: str, ctx: TraceContext, parent_id: int | None, start: float, end: float, *,
             kind: Kind = "internal", attrs: Attrs | None = None, error: str | None = None) -> None:
        """One finished span: ``ctx`` names its trace and its own id; ``parent_id`` its
        parent's span (None: the root of the trace)."""
        trace, Context, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags = self._otel  # noqa: N806
        if parent_id is None:  # a root: its trace id is the one chosen and sent on
            parent = Context()
            self._ids.next_trace_id = ctx.trace_id
        else:
            parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
                ctx.trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        self._ids.next_span_id = ctx.span_id
        span = self._tracer.start_span(name, context=parent, kind=self._kinds[kind], attributes=attrs,
                                       start_time=_seconds_ns(start))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
            span.set_attribute("error.type", error)
        span.end(end_time=_seconds_ns(max(end, start)))

    def flush(self, timeout_s: float = 5.0) -> None:
        self.provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self.provider.shutdown()


async def shutdown(tracing: Tracing | None) -> None:
    """A service's last spans sent as it stops (on a thread: the export blocks)."""
    if tracing is not None:
        await asyncio.to_thread(tracing.close)


def tracing_from(cfg: TelemetryConfig, service: str) -> Tracing | None:
    """The service's tracing, or None when no endpoint is configured."""
    return Tracing(cfg, service) if cfg.otlp_endpoint else None
