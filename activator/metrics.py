"""The activator's Prometheus metrics, on a registry of its own (one per app)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)

# OpenTelemetry's GenAI semantic conventions, as Prometheus names them (dots to
# underscores, the unit as a suffix): the buckets they advise, the time ones extended
# past their last (10 s, 82 s) for cold starts, which they do not count on.
GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                      30.0, 60.0, 120.0, 300.0, 600.0)
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
                          163.84, 327.68, 655.36)
GENAI_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)


F = TypeVar("F", Counter, Gauge, Histogram)


class Children(Generic[F]):
    """A labelled family whose children are kept by their label values. Its ``labels()``
    is the family's without the cost: prometheus_client converts, checks and locks on
    every call (about 2 µs), and a completion request makes ten."""

    def __init__(self, family: F) -> None:
        self.family: F = family
        self._children: dict[tuple[Any, ...], Any] = {}

    def labels(self, *values: Any) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.family.labels(*values)
        return child

    def __getattr__(self, name: str) -> Any:
        return getattr(self.family, name)


class ActivatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # tier: where the replica got the model (asleep, host, disk, s3, launch: thaw.wire.Tier).
        self.cold_starts = Counter("thaw_cold_starts_total", "Cold starts served (one per activation)",
                                   ["model", "tier"], registry=registry)
        self.cold_start_seconds = Histogram(
            "thaw_cold_start_seconds", "Time of each cold-start phase (phase='total': request to first token)",
            ["model", "phase", "tier"], buckets=_SECONDS, registry=registry)
        self.replicas = Gauge("thaw_replicas", "Replicas per model by state", ["model", "state"], registry=registry)
        self.queue_depth = Gauge("thaw_queue_depth", "Requests waiting in the cold queue", ["model"], registry=registry)
        self.ttft = Children(Histogram("thaw_ttft_seconds", "Time from request arrival to the first byte of the answer, "
                                       "by start: hot (a ready replica at arrival) or cold (held for a cold start)",
                                       ["model", "start"], buckets=_SECONDS, registry=registry))
        self.requests = Children(Counter("thaw_requests_total", "Requests answered, by HTTP status",
                                         ["model", "status"], registry=registry))
        # Each tenant's completion requests by outcome (ok, or the error's code: a limit
        # hit is rate_limit_requests, rate_limit_tokens, tokens_exceeded or
        # concurrency_limit_exceeded) and its tokens (input, output), as recorded.
        self.tenant_requests = Children(Counter("thaw_tenant_requests_total", "Completion requests by tenant and outcome",
                                                ["tenant", "outcome"], registry=registry))
        self.tenant_tokens = Children(Counter("thaw_tenant_tokens_total", "Tokens by tenant and type (input, output)",
                                              ["tenant", "type"], registry=registry))
        # The GenAI conventions' server metrics (gen_ai.server.time_to_first_token, its
        # request duration, and the token usage): ``gen_ai_request_model`` is the model
        # as the client named it (its served name); time to first token includes the
        # time a request was held for a cold start.
        op = ["gen_ai_operation_name", "gen_ai_request_model"]
        self.genai_ttft = Children(Histogram("gen_ai_server_time_to_first_token_seconds",
                                             "Time to generate the first token, held time included (GenAI conventions)",
                                             op, buckets=GENAI_TTFT_BUCKETS, registry=registry))
        self.genai_duration = Children(Histogram("gen_ai_server_request_duration_seconds",
                                                 "Request duration to the last byte; error_type set on failures "
                                                 "(GenAI conventions)", [*op, "error_type"], buckets=GENAI_DURATION_BUCKETS,
                                                 registry=registry))
        self.genai_tokens = Children(Histogram("gen_ai_client_token_usage", "Input and output tokens per request "
                                               "(GenAI conventions' token usage)", [*op, "gen_ai_token_type"],
                                               buckets=GENAI_TOKEN_BUCKETS, registry=registry))
        # refused: 401; throttled: 429, the client's address over its budget (activator/throttle.py).
        self.auth_failures = Counter("thaw_auth_failures_total",
                                     "Requests with a missing or invalid API key, by outcome",
                                     ["outcome"], registry=registry)
        self.upstream_retries = Counter("thaw_upstream_retries_total",
                                        "Requests retried on another replica after one failed before its first byte",
                                        ["model"], registry=registry)
        # Usage shipping (activator/shipping.py): its lag is computed at scrape time.
        self.usage_shipped_records = Counter("thaw_usage_shipped_records_total",
                                             "Usage records shipped to the object store", registry=registry)
        self.usage_shipped_segments = Counter("thaw_usage_shipped_segments_total",
                                              "Usage segments shipped to the object store", registry=registry)
        self.usage_ship_failures = Counter("thaw_usage_ship_failures_total",
                                           "Usage shipping ticks that failed (retried on the next)",
                                           registry=registry)
        self.usage_ship_lag = Gauge("thaw_usage_ship_lag_seconds",
                                    "Seconds since the oldest usage record not yet known to be in the store "
                                    "was committed, or since the last successful ship", registry=registry)
        # limits.backend redis: 1 while Redis cannot be reached and this activator admits
        # by its own share of each limit (limit / activators).
        self.limits_degraded = Gauge("thaw_limits_degraded",
                                     "1 while the shared limits store is unreachable and limits are per-activator shares",
                                     registry=registry)
        self.limits_degraded_admissions = Counter(
            "thaw_limits_degraded_admissions_total",
            "Requests admitted or refused by this activator's share of the limits (the shared store unreachable)",
            registry=registry)
        # Batch lines on this activator's spare slots (activator/batch/worker.py).
        self.batch_running = Gauge("thaw_batch_running", "Batch requests running now, per model", ["model"],
                                   registry=registry)
        # answered: sent to the controller and kept; answered_twice: sent, but the line had
        # an answer already (not billed); yielded: cut for an online request; given_back:
        # returned unanswered (cut, no room after all); failed: returned after a failed run
        # (a replica gone or answering 5xx).
        self.batch_lines = Counter("thaw_batch_lines_total", "Batch lines run here, by outcome",
                                   ["model", "outcome"], registry=registry)
        # exact: the prompt rendered and encoded before admission; bound: admitted on its
        # upper bound from the request's bytes (activator/token_bound.py), not counted.
        self.prompt_counts = Children(Counter("thaw_prompt_counts_total",
                                              "Requests admitted on an exact prompt count or on the bound, by how",
                                              ["how"], registry=registry))
        self.limits_store_seconds = Histogram(
            "thaw_limits_store_seconds", "Time of one call to the shared limits store", ["op"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), registry=registry)
