"""The agent's Prometheus metrics, in a registry of its own (no global state)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
)

from thaw.wire import REPORTED_STATES, WorkerState

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.state = Gauge(
            "thaw_worker_state", "1 for the worker's current state, 0 for the others",
            ["state"], registry=self.registry,
        )
        self.engine_start = Histogram(
            "thaw_worker_engine_start_seconds",
            "From an accepted assignment to the engine answering /health",
            buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.sleep_seconds = Histogram(
            "thaw_worker_engine_sleep_seconds",
            "Putting an idle engine to sleep (vLLM sleep mode), after it drained",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.preemption_seconds = Histogram(
            "thaw_worker_batch_preemption_seconds",
            "Taking the worker from its batch assignment for another one: the batch engine "
            "killed and the spare engine host in its place",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "thaw_worker_cache_bytes", "Bytes of model weights the worker's cache tiers hold",
            ["tier"], registry=self.registry,
        )
        self.heartbeats = Gauge(
            "thaw_worker_heartbeat_failures", "Heartbeats in a row the controller did not accept",
            registry=self.registry,
        )
        self.set_state(WorkerState.STARTING)

    def set_state(self, current: WorkerState) -> None:
        for s in WorkerState:
            if s in REPORTED_STATES:
                self.state.labels(s.value).set(1 if s is current else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
