"""The files of a `thaw load run` directory, as pydantic models: one place for their shapes.

``requests.jsonl`` holds one :class:`RequestRecord` per line (in the order the
requests ended), ``run.json`` the :class:`RunInfo`, ``replicas.jsonl`` one
:class:`ReplicaSample` per controller poll (only with ``--controller-url``), and
``report.json`` (written by `thaw load report`) the :class:`Report`. Times named
``*_s`` without a date are seconds from the run's start.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"
REPLICAS_FILE = "replicas.jsonl"
REPORT_FILE = "report.json"

# Values of x-thaw-tier; "cold" when the header is absent and x-thaw-cold-start is "true".
TIERS = ("hot", "asleep", "host", "disk", "s3", "launch", "cold")


class _Model(BaseModel):
    # A misspelt field is an error, not a silently ignored one.
    model_config = ConfigDict(extra="forbid")


class RequestRecord(_Model):
    """One request of the replay, as the client saw it."""

    index: NonNegativeInt  # the request's position in the trace (after reading)
    trace_model: str
    model: str  # the served name sent as `model` (after --model-map)
    tenant: str | None = None  # the trace's tenant (all requests use one API key)
    input_tokens: NonNegativeInt  # the trace's input tokens (the prompt is about this long)
    max_tokens: NonNegativeInt  # the trace's output tokens, capped by --max-tokens-cap
    scheduled_s: float  # trace time / speedup
    sent_s: float  # when the generator sent it
    lag_s: float  # sent_s - scheduled_s: how late the generator was
    end_s: float | None = None  # when the stream ended, failed or was cancelled
    request_id: str | None = None  # x-request-id
    cold_start: bool | None = None  # x-thaw-cold-start
    queue_ms: float | None = None  # x-thaw-queue-ms
    replica: str | None = None  # x-thaw-replica
    tier: str | None = None  # x-thaw-tier, else "hot"/"cold" from x-thaw-cold-start; None: no headers
    tier_from_header: bool = False  # whether tier came from x-thaw-tier
    ttft_s: float | None = None  # sent to the first content token
    inter_token_s: list[float] = Field(default_factory=list)  # gaps between content chunks
    completion_tokens: NonNegativeInt = 0  # the server's usage, else content chunks counted
    prompt_tokens: NonNegativeInt | None = None  # the server's usage
    status: int | None = None  # HTTP status; None when no answer came (connection, timeout)
    error_type: str | None = None  # the exception's class name
    error: str | None = None  # its message, shortened
    finished: bool = False  # the stream ran to its end without error
    cancelled: bool = False  # still running when the grace after the window ran out


class LagSummary(_Model):
    """How late the generator sent requests against its schedule."""

    threshold_ms: NonNegativeFloat
    over_threshold: NonNegativeInt  # sends later than threshold_ms
    max_ms: float | None
    p50_ms: float | None
    p99_ms: float | None


class RunConfig(_Model):
    """The options of the run (never the API key or the cluster token)."""

    trace: str
    format: str | None
    base_url: str
    speedup: float
    max_requests: int | None
    duration_s: float | None
    model_map: dict[str, str]
    seed: int
    max_tokens_cap: int | None
    max_input_tokens: int | None
    timeout_s: float
    grace_s: float
    send_overhead_ms: float
    controller_url: str | None
    poll_interval_s: float


class RunCounts(_Model):
    trace_requests: NonNegativeInt  # requests in the trace as read
    scheduled: NonNegativeInt  # of those, in the window and within --max-requests
    sent: NonNegativeInt
    completed: NonNegativeInt
    errors: NonNegativeInt
    cancelled: NonNegativeInt


class RunInfo(_Model):
    """``run.json``: what was run, when, and whether the generator kept its schedule."""

    config: RunConfig
    started_at: float  # epoch seconds of the run's time 0
    window_s: float  # the last send may be scheduled up to here
    duration_s: float  # time 0 to the end of the last request (or its cancellation)
    counts: RunCounts
    lag: LagSummary
    # True when the generator itself fell behind: the p99 of send lag over the threshold.
    # Then the arrivals the stack saw were not the trace's, and latencies measured from
    # the send time understate what the schedule asked for.
    generator_fell_behind: bool
    replicas_source: Literal["controller", "x-thaw-replica"]
    controller_poll_errors: NonNegativeInt = 0


class ReplicaSample(_Model):
    """One poll of the controller's /v1/state: replicas per state of one model."""

    t_s: float
    model: str  # the served name
    replicas: dict[str, int]


class Dist(_Model):
    """Nearest-rank percentiles of a sample (None when it is empty)."""

    n: NonNegativeInt
    p50: float | None
    p90: float | None
    p99: float | None


class GroupStats(_Model):
    requests: NonNegativeInt
    completed: NonNegativeInt
    errors: NonNegativeInt
    cancelled: NonNegativeInt
    ttft_s: Dist  # over completed requests
    tpot_ms: Dist  # over completed requests with at least 2 tokens
    good: NonNegativeInt  # completed and within both SLOs


class Slo(_Model):
    ttft_s: float
    tpot_ms: float


class Report(_Model):
    """``report.json``: `thaw load report`'s figures."""

    run_dir: str
    slo: Slo
    duration_s: float
    counts: RunCounts
    goodput_rps: float  # requests within both SLOs per second of the run
    overall: GroupStats
    by_tier: dict[str, GroupStats]
    by_model: dict[str, GroupStats]
    errors_by_status: dict[str, int]
    generator_fell_behind: bool
    lag: LagSummary
    replicas_source: str
