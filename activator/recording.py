"""What a completion request leaves behind: its usage record in the ledger (its tokens
then settled with the tenant's limits), its time to first byte (the TTFT histogram and,
for a hot request, the autoscaler's sample), and for the first request a cold-started
replica answers, the split of that wait into phases, sent to the controller.
"""

from __future__ import annotations

from collections.abc import Callable

from activator.context import RequestContext
from activator.ledger import Ledger, UsageRecord
from activator.limits import Limiter
from activator.metrics import ActivatorMetrics
from activator.routing.replicas import Replica, cold_phases, cold_start_tier
from activator.routing.router import Router
from activator.tracing import request_spans
from thaw.config import Model
from thaw.log import get_logger
from thaw.telemetry import Tracing
from thaw.wire import ColdStartRecord, LoadSource

log = get_logger()


class RequestRecorder:
    def __init__(self, ledger: Ledger, limiter: Limiter, metrics: ActivatorMetrics, routes: Router,
                 clock: Callable[[], float], tracing: Tracing | None = None) -> None:
        self._ledger = ledger
        self.tracing = tracing
        self._limiter = limiter
        self._metrics = metrics
        self._routes = routes
        self._clock = clock
        # The assignments whose cold start was recorded: one record per replica.
        self._recorded_cold: set[str] = set()

    async def record(self, ctx: RequestContext, error_code: str | None = None) -> None:
        """Append this request's usage record once (no-op before authentication)."""
        if ctx.recorded or ctx.tenant is None:
            return
        ctx.recorded = True
        now = self._clock()
        try:
            # The record first: a limits store that is slow or away cannot hold it back.
            await self._ledger.append(UsageRecord(
                request_id=ctx.request_id, tenant=ctx.tenant, model=ctx.model.name if ctx.model else None,
                status=ctx.status, error_code=error_code, prompt_tokens=ctx.usage.prompt_tokens,
                completion_tokens=ctx.usage.completion_tokens, cached_tokens=ctx.usage.cached_tokens,
                usage_source=ctx.usage.source, queue_ms=round(ctx.queue_s * 1000, 3),
                ttft_ms=round((ctx.first_byte_at - ctx.arrival) * 1000, 3) if ctx.first_byte_at else None,
                duration_ms=round((now - ctx.arrival) * 1000, 3), cold_start=ctx.cold, cancelled=ctx.cancelled,
                stream=ctx.stream, replica=ctx.replica, started_at=ctx.arrival, finished_at=now,
                revision=ctx.revision, service_tier=ctx.service_tier,
            ))
        finally:
            self._genai_end(ctx, error_code, now)
            if self.tracing is not None:
                request_spans(self.tracing, ctx, error_code, now)
            if ctx.admission is not None:
                try:
                    await self._limiter.settle(ctx.admission, ctx.usage.prompt_tokens + ctx.usage.completion_tokens,
                                              now)
                except Exception:
                    log.exception("limits_settle_failed")

    def _genai_end(self, ctx: RequestContext, error_code: str | None, now: float) -> None:
        """The GenAI conventions' duration and token usage of a completion request, and
        the tenant's counts."""
        m = self._metrics
        assert ctx.tenant is not None
        m.tenant_requests.labels(ctx.tenant, error_code or ("ok" if ctx.status < 400 else str(ctx.status))).inc()
        if ctx.usage.prompt_tokens:
            m.tenant_tokens.labels(ctx.tenant, "input").inc(ctx.usage.prompt_tokens)
        if ctx.usage.completion_tokens:
            m.tenant_tokens.labels(ctx.tenant, "output").inc(ctx.usage.completion_tokens)
        if ctx.operation is None or ctx.model is None:
            return
        name = ctx.model.resolved_served_name
        failed = error_code or (str(ctx.status) if ctx.status >= 400 else "")
        m.genai_duration.labels(ctx.operation, name, failed).observe(now - ctx.arrival)
        if ctx.usage.prompt_tokens is not None:
            m.genai_tokens.labels(ctx.operation, name, "input").observe(ctx.usage.prompt_tokens)
        if ctx.usage.completion_tokens is not None:
            m.genai_tokens.labels(ctx.operation, name, "output").observe(ctx.usage.completion_tokens)

    def first_byte(self, model: Model, replica: Replica, ctx: RequestContext) -> None:
        """The answer's first byte came from ``replica``: its time, and a cold start's record."""
        now = self._clock()
        ctx.first_byte_at = now
        if ctx.trace is not None:
            ctx.served_by = replica
        self._metrics.ttft.labels(model.name, "cold" if ctx.cold else "hot").observe(now - ctx.arrival)
        if ctx.operation is not None:
            self._metrics.genai_ttft.labels(ctx.operation, model.resolved_served_name).observe(now - ctx.arrival)
        if not ctx.cold:
            # The autoscaler's TTFT target is about serving capacity, not cold starts.
            self._routes.note_ttft(model.name, now - ctx.arrival)
        if ctx.cold and replica.assignment_id and replica.assignment_id not in self._recorded_cold:
            self._recorded_cold.add(replica.assignment_id)
            self._cold_start(model, replica, ctx, now)

    def _cold_start(self, model: Model, replica: Replica, ctx: RequestContext, first_token: float) -> None:
        """Split request → first token into the named phases, from the worker's milestones."""
        p = replica.phases
        phases = {name: end - start
                  for name, start, end in cold_phases(ctx.arrival, ctx.enqueued_at, replica, first_token)}
        total = first_token - ctx.arrival
        tier = cold_start_tier(ctx.enqueued_at or ctx.arrival, replica)
        self._metrics.cold_starts.labels(model.name, tier).inc()
        for name, secs in phases.items():
            self._metrics.cold_start_seconds.labels(model.name, name, tier).observe(secs)
        self._metrics.cold_start_seconds.labels(model.name, "total", tier).observe(total)
        record = ColdStartRecord(model=model.name, request_id=ctx.request_id, at=ctx.arrival,
                                 total_s=round(total, 3), phases_s={k: round(v, 3) for k, v in phases.items()},
                                 # Woken from the asleep tier rather than loaded.
                                 woken=p.get("woken") is not None, tier=tier, load_s=replica.load_s,
                                 weights_from=_weights_from(replica.load_tier),
                                 swap_steps_s=replica.swap_steps_s)
        log.info("cold_start", **record.model_dump())
        self._routes.record_cold_start(record)


def _weights_from(load_tier: str | None) -> LoadSource | None:
    """Where a replica's weights came from (None: woken, or not reported)."""
    return load_tier if load_tier in ("host", "disk", "s3", "local") else None  # type: ignore[return-value]
