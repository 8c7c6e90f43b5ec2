"""A completion request's spans, made as it ends (``thaw.telemetry``): the request as the
GenAI conventions name it (``{gen_ai.operation.name} {gen_ai.request.model}``) and, for a
cold start, each phase of its wait as a child, split at the worker's milestones as the
cold-start record is; a hot request has one child, its wait for the first token.

Kept when the request was a cold start, failed, or its trace is sampled (the caller's
decision, else ``telemetry.sample_ratio``). Attributes follow the conventions where they
name the fact, else Thaw's own under ``thaw.``; no prompt or answer text.
"""

from __future__ import annotations

from activator.context import RequestContext
from activator.routing.replicas import cold_phases
from thaw.telemetry import Tracing


def kept(ctx: RequestContext, error_code: str | None) -> bool:
    return ctx.trace is not None and (ctx.trace.sampled or ctx.cold or bool(error_code) or ctx.status >= 400)


def request_spans(tracing: Tracing, ctx: RequestContext, error_code: str | None, now: float) -> None:
    """The request's spans, if it is kept."""
    trace = ctx.trace
    if trace is None or not kept(ctx, error_code):
        return
    model = ctx.model.resolved_served_name if ctx.model else "unknown"
    error = error_code or (str(ctx.status) if ctx.status >= 400 else None)
    attrs: dict[str, str | bool | int | float] = {
        "gen_ai.operation.name": ctx.operation or "chat", "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": ctx.usage.prompt_tokens, "gen_ai.usage.output_tokens": ctx.usage.completion_tokens,
        "http.response.status_code": ctx.status, "thaw.request_id": ctx.request_id, "thaw.cold_start": ctx.cold,
        "thaw.stream": ctx.stream, "thaw.cancelled": ctx.cancelled, "thaw.queue_s": round(ctx.queue_s, 6),
    }
    if ctx.usage.finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = ",".join(ctx.usage.finish_reasons)
    for key, value in (("thaw.tenant", ctx.tenant), ("thaw.tier", ctx.tier), ("thaw.replica", ctx.replica),
                       ("gen_ai.response.model", model if ctx.replica else None)):
        if value is not None:
            attrs[key] = value
    if ctx.revision is not None:
        attrs["thaw.revision"] = ctx.revision
    tracing.span(f"{ctx.operation or 'chat'} {model}", trace, ctx.trace_parent_id, ctx.arrival, now,
                 kind="server", attrs=attrs, error=error)
    first = ctx.first_byte_at
    rep = ctx.served_by
    if ctx.cold and rep is not None and first is not None:
        for name, start, end in cold_phases(ctx.arrival, ctx.enqueued_at, rep, first):
            phase: dict[str, str | bool | int | float] = {"thaw.phase": name}
            if name == "weights_loaded":
                if rep.load_tier:
                    phase["thaw.load.tier"] = rep.load_tier
                if rep.load_s is not None:
                    phase["thaw.load.seconds"] = rep.load_s
                if rep.load_bytes is not None:
                    phase["thaw.load.bytes"] = rep.load_bytes
                phase["thaw.load.swap"] = rep.load_swap
            tracing.span(f"thaw.{name}", trace.child(), trace.span_id, start, end, attrs=phase)
    elif ctx.cold:  # never answered: the whole wait was the queue
        tracing.span("thaw.queued", trace.child(), trace.span_id, ctx.arrival, now, attrs={"thaw.phase": "queued"},
                     error=error)
    elif first is not None:
        tracing.span("thaw.first_token", trace.child(), trace.span_id, ctx.arrival, first,
                     attrs={"thaw.phase": "first_token"})
