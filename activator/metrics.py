"""The activator's Prometheus metrics, on a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("queued", "instance_acquired", "snapshot_restored", "weights_loaded", "engine_ready", "first_token")

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


class ActivatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.cold_starts = Counter("thaw_cold_starts_total", "Cold starts served (one per activation)",
                                   ["model"], registry=registry)
        self.cold_start_seconds = Histogram(
            "thaw_cold_start_seconds", "Time of each cold-start phase (phase='total': request to first token)",
            ["model", "phase"], buckets=_SECONDS, registry=registry)
        self.replicas = Gauge("thaw_replicas", "Replicas per model by state", ["model", "state"], registry=registry)
        self.queue_depth = Gauge("thaw_queue_depth", "Requests waiting in the cold queue", ["model"], registry=registry)
        self.ttft = Histogram("thaw_ttft_seconds", "Time from request arrival to the first byte of the answer",
                              ["model"], buckets=_SECONDS, registry=registry)
        self.requests = Counter("thaw_requests_total", "Requests answered, by HTTP status",
                                ["model", "status"], registry=registry)
        self.upstream_retries = Counter("thaw_upstream_retries_total",
                                        "Requests retried on another replica after one failed before its first byte",
                                        ["model"], registry=registry)
