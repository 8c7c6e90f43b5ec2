"""The worker's part of a cold start's trace (``thaw.telemetry``).

An assignment whose control call carried a W3C ``traceparent`` (the controller sends
one when a traced request waits for the model: ``warm_pool.fleet.start_traces``) ends
in a span ``thaw.load {model}`` under that call, from its acceptance to the engine's
readiness (or the failure), with a child per step the worker observed: the snapshot
restore, the weights (where from, how many bytes, swapped or loaded) and the engine's
start. Made from the agent's facts when the assignment ends its load; nothing is
timed twice.
"""

from __future__ import annotations

from thaw.telemetry import TraceContext, Tracing, parse_traceparent
from worker.state import Assignment, Facts


class LoadTraces:
    def __init__(self, tracing: Tracing | None, worker_id: str) -> None:
        self.tracing = tracing
        self.worker_id = worker_id
        self._traced: dict[str, TraceContext] = {}  # assignment id -> the control call's context

    def assigned(self, assignment_id: str, traceparent: str | None) -> None:
        """An assign call for ``assignment_id`` came with ``traceparent`` (or none)."""
        if self.tracing is None:
            return
        parent = parse_traceparent(traceparent)
        if parent is not None:
            self._traced[assignment_id] = parent

    def ended(self, a: Assignment, facts: Facts, now: float, error: str | None = None) -> None:
        """The load of ``a`` ended: ready (``error`` None) or failed (its kind)."""
        parent = self._traced.pop(a.assignment_id, None)
        if parent is None or self.tracing is None:
            return
        load = parent.child()
        attrs: dict[str, str | bool | int | float] = {
            "gen_ai.request.model": a.model, "thaw.worker_id": self.worker_id, "thaw.assignment_id": a.assignment_id}
        lv = facts.load
        if lv is not None:
            attrs.update({"thaw.load.tier": lv.tier, "thaw.load.swap": lv.swap})
            if lv.bytes is not None:
                attrs["thaw.load.bytes"] = lv.bytes
            if lv.seconds is not None:
                attrs["thaw.load.seconds"] = lv.seconds
        end = facts.engine_ready_at or now
        self.tracing.span(f"thaw.load {a.model}", load, parent.span_id, a.assigned_at, end, attrs=attrs, error=error)
        steps: list[tuple[str, float | None, float | None, dict[str, str | bool | int | float]]] = []
        snap = facts.snapshot
        snap_attrs: dict[str, str | bool | int | float] = {"thaw.snapshot.status": snap.status} if snap else {}
        if snap is not None and snap.bytes is not None:
            snap_attrs["thaw.snapshot.bytes"] = snap.bytes
        steps.append(("thaw.snapshot_restore", a.assigned_at, facts.snapshot_restored_at, snap_attrs))
        weights_from = facts.launched_at or facts.snapshot_restored_at or a.assigned_at
        steps.append(("thaw.weights_load", weights_from, facts.weights_loaded_at,
                      {k: v for k, v in attrs.items() if k.startswith("thaw.load.")}))
        steps.append(("thaw.engine_start", facts.weights_loaded_at or facts.launched_at, facts.engine_ready_at, {}))
        for name, start, stop, step_attrs in steps:
            if start is not None and stop is not None:
                self.tracing.span(name, load.child(), load.span_id, start, stop, attrs=step_attrs)
