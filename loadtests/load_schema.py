"""The files of a `thaw load run` directory, as pydantic models: one place for their shapes.

``requests.jsonl`` holds one :class:`RequestRecord` per line (in the order the
requests ended), ``run.json`` the :class:`RunInfo`, ``replicas.jsonl`` one
:class:`ReplicaSample` per controller poll (only with ``--controller``), and
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


# -- `thaw load calibrate` -------------------------------------------------------------
#
# DIR/costs.json is the simulator's costs file (``simulator.costs``: only its keys);
# how each figure was taken, and the samples behind it, go in ``calibration.json``'s
# ``costs`` (a :class:`CostModelReport`) and DIR/cost_samples.json (:class:`CostMeasurements`).

CALIBRATION_FILE = "calibration.json"
COSTS_FILE = "costs.json"
COST_SAMPLES_FILE = "cost_samples.json"
CALIBRATION_TRACE_FILE = "trace.csv"


class TraceParams(_Model):
    """How the calibration's trace was cut from its source: a window, thinned, sped up,
    spread over the models, token counts capped (all deterministic given ``seed``)."""

    source_file: str
    start_s: NonNegativeFloat  # the window's start in the source (seconds from its start)
    duration_s: float = Field(gt=0)  # the compressed trace's length; the window is duration_s x speedup
    speedup: float = Field(gt=0)
    rate_per_s: float = Field(gt=0)  # mean arrivals per second after compression (all models)
    models: int = Field(ge=1)
    zipf_s: NonNegativeFloat  # model k (from 0) draws a request with weight 1 / (k + 1) ** zipf_s
    seed: int
    max_input_tokens: int = Field(ge=1)
    max_output_tokens: int = Field(ge=1)


class TraceInfo(_Model):
    file: str  # DIR/trace.csv, generic format: what both the live run and the simulator read
    citation: str
    source: str  # the trace's provenance chain (simulator.traces' ``source``)
    params: TraceParams
    requests: NonNegativeInt
    duration_s: float  # the last arrival
    per_model: dict[str, int]


class TierProbe(_Model):
    """One cold start of a model at zero from a chosen tier, and the hot requests with
    the same prompt right after it (the request's own share of its TTFT)."""

    tier: str  # the tier the caches were prepared for
    served_tier: str | None  # x-thaw-tier of the answer: the sample counts only when it is ``tier``
    ttft_s: float | None
    hot_ttft_s: list[float] = Field(default_factory=list)
    request_id: str | None = None
    load_s: float | None = None  # the loader's own time, from the activator's cold-start record
    phases_s: dict[str, float] = Field(default_factory=dict)
    error: str | None = None


class HotSample(_Model):
    """A request to a model with a ready replica, alone on it (nothing else in flight)."""

    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt
    ttft_s: float
    tpot_s: float | None  # (last content chunk - first) / (completion_tokens - 1)


class Interval(_Model):
    """A worker's release (release decision -> standby again) or boot (launch decision -> standby)."""

    worker_id: str
    start_at: float  # epoch seconds of the decision
    seconds: NonNegativeFloat


class CostMeasurements(_Model):
    """``cost_samples.json``: every sample the cost model was taken from."""

    weights_bytes: NonNegativeInt
    tier_probes: list[TierProbe]
    hot: list[HotSample]
    releases: list[Interval]
    boots: list[Interval]


class CostFigure(_Model):
    value: float
    n: NonNegativeInt  # samples behind it (0: not measured, the value is a stand-in)
    method: str


class CostModelReport(_Model):
    """The cost model as measured: each figure with how it was taken. ``costs_file`` is
    exactly what ``costs.json`` holds; ``boot_s`` goes into the simulated shape instead."""

    figures: dict[str, CostFigure]
    costs_file: dict[str, dict[str, float]]
    boot_s: CostFigure


class SideBySide(_Model):
    """One figure, live and simulated; ``rel_diff`` = (sim - live) / live (None when live is 0
    or either is missing; 0 when both are 0)."""

    metric: str
    live: float | None
    sim: float | None
    rel_diff: float | None


class Goal(_Model):
    metric: str
    tolerance: float  # |rel_diff| at most this
    live: float | None
    sim: float | None
    rel_diff: float | None
    met: bool | None  # None: not measurable (a side missing)


class Verdict(_Model):
    goals: list[Goal]
    met: bool
    not_met: list[str]  # metrics of the goals not met (or not measurable)
    text: str


class Calibration(_Model):
    """``calibration.json``: the live run and the simulation of the same trace, side by side."""

    out_dir: str
    started_at: float  # epoch seconds
    wall_s: float
    stack: dict[str, object]  # models, pool, autoscaling and cache settings the stack ran with
    trace: TraceInfo
    costs: CostModelReport
    # The share of the trace's length one engine spends serving it at the measured speeds
    # (load_calibrate.serving_share): how much the live run loads this machine's cores.
    serving_share: NonNegativeFloat
    live_counts: RunCounts
    generator_fell_behind: bool
    rows: list[SideBySide]  # what the goal is about: cold starts, replica-seconds, TTFT, requests
    diagnostics: list[SideBySide]  # what explains differences: per-tier cold TTFT, releases, boots
    verdict: Verdict
    notes: list[str] = Field(default_factory=list)
