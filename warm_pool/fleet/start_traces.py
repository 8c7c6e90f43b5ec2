"""The controller's part of a cold start's trace (``thaw.telemetry``).

An activator's demand signal carries the W3C context of a traced request that waits for
the model. The first one per model is kept until the controller starts a replica of that
model; the start then makes two spans in the request's trace: ``thaw.assign {model}``,
from the demand's arrival to the worker's answer (the decision and the call), and within
it the call itself, ``POST /assign`` (or ``/engines``), whose context the call carries
to the worker (``CONTROL_TRACE``, read by ``warm_pool.fleet.control``), so the worker's
spans of the load join the same trace.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from thaw.telemetry import TraceContext, Tracing, parse_traceparent

# The traceparent a control call to a worker carries (None: none). Set in the task that
# makes the call, so no other call sees it.
CONTROL_TRACE: contextvars.ContextVar[str | None] = contextvars.ContextVar("thaw_control_trace", default=None)

# A demand whose model was not started within this long is forgotten.
KEPT_S = 600.0
# At most this many models' demands are kept (the oldest go first).
MAX_KEPT = 10_000


@dataclass(frozen=True)
class _Waiting:
    trace: TraceContext
    at: float


class StartTraces:
    def __init__(self, tracing: Tracing | None, clock: Callable[[], float]) -> None:
        self.tracing = tracing
        self._clock = clock
        self._waiting: dict[str, _Waiting] = {}

    def demanded(self, model: str, traceparent: str | None) -> None:
        """A request traced as ``traceparent`` waits for ``model`` (the first is kept)."""
        if self.tracing is None or model in self._waiting:
            return
        trace = parse_traceparent(traceparent)
        if trace is None:
            return
        if len(self._waiting) >= MAX_KEPT:
            del self._waiting[next(iter(self._waiting))]
        self._waiting[model] = _Waiting(trace, self._clock())

    def _take(self, model: str) -> _Waiting | None:
        w = self._waiting.pop(model, None)
        if w is None or self._clock() - w.at > KEPT_S:
            return None
        return w

    @contextmanager
    def starting(self, model: str, path: str, attrs: dict[str, str | bool | int | float]) -> Iterator[list[str]]:
        """Around the control call that starts a replica of ``model``: its spans, when a
        traced request waits for it. The caller appends an error kind to the yielded
        list when the call failed."""
        errors: list[str] = []
        w = self._take(model) if self.tracing is not None else None
        if w is None:
            yield errors
            return
        assert self.tracing is not None
        assign = w.trace.child()
        call = assign.child()
        token = CONTROL_TRACE.set(call.traceparent())
        started = self._clock()
        try:
            yield errors
        except BaseException as exc:
            errors.append(type(exc).__name__)
            raise
        finally:
            CONTROL_TRACE.reset(token)
            now = self._clock()
            error = errors[0] if errors else None
            self.tracing.span(f"thaw.assign {model}", assign, w.trace.span_id, w.at, now,
                              attrs={"gen_ai.request.model": model, **attrs}, error=error)
            self.tracing.span(f"POST {path}", call, assign.span_id, started, now, kind="client",
                              attrs={"http.request.method": "POST", "url.path": path}, error=error)
