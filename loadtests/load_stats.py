"""The arithmetic of `thaw load run` and `thaw load report`, as pure functions.

No file, clock or network here: records in, figures out, so a test can check each
figure from a table. Percentiles are nearest-rank (the smallest value with at least
``q`` percent of the sample at or below it): always an observed value, and for
``1..100`` the p50, p90, p99 are 50, 90, 99.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from loadtests.load_schema import (
    Dist,
    GroupStats,
    LagSummary,
    Report,
    RequestRecord,
    RunCounts,
    RunInfo,
    Slo,
)

DEFAULT_LAG_THRESHOLD_MS = 50.0


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``xs`` (None for an empty sample)."""
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], not {q}")
    if not xs:
        return None
    s = sorted(xs)
    k = max(1, math.ceil(q / 100 * len(s)))
    return s[k - 1]


def dist(xs: Sequence[float]) -> Dist:
    return Dist(n=len(xs), p50=percentile(xs, 50), p90=percentile(xs, 90), p99=percentile(xs, 99))


# -- one request ---------------------------------------------------------------------


def tier_of(cold_start_header: str | None, tier_header: str | None) -> str | None:
    """The cold-start tier of a request: ``x-thaw-tier`` when the activator sent it, else
    "hot" or "cold" from ``x-thaw-cold-start``; None when neither header came (no answer)."""
    if tier_header:
        return tier_header.strip().lower()
    if cold_start_header is None:
        return None
    return "hot" if cold_start_header.strip().lower() == "false" else "cold"


def completed(r: RequestRecord) -> bool:
    """The stream ran to its end without an error."""
    return r.finished and not r.cancelled and r.error_type is None


def failed(r: RequestRecord) -> bool:
    """An error: anything that neither completed nor was cancelled at the run's end."""
    return not completed(r) and not r.cancelled


def tpot_ms(r: RequestRecord) -> float | None:
    """Time per output token after the first, in ms: the first to the last content token
    over ``completion_tokens - 1`` (None below two tokens: there is no such time)."""
    if r.ttft_s is None or r.completion_tokens < 2 or not r.inter_token_s:
        return None
    return sum(r.inter_token_s) / (r.completion_tokens - 1) * 1000.0


def within_slo(r: RequestRecord, slo: Slo) -> bool:
    """Completed, TTFT at most ``slo.ttft_s`` and TPOT at most ``slo.tpot_ms`` (a request
    of fewer than two tokens has no TPOT and meets that part)."""
    if not completed(r) or r.ttft_s is None or r.ttft_s > slo.ttft_s:
        return False
    t = tpot_ms(r)
    return t is None or t <= slo.tpot_ms


def error_key(r: RequestRecord) -> str:
    """How an error is counted: its HTTP status when the server answered with one, else
    the exception's type (a timeout, a refused connection, an error frame mid-stream)."""
    if r.status is not None and r.status != 200:
        return str(r.status)
    return r.error_type or "unknown"


# -- groups --------------------------------------------------------------------------


def group_by(records: Iterable[RequestRecord], key: Callable[[RequestRecord], str]) -> dict[str, list[RequestRecord]]:
    """Records per key, keys sorted."""
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


def group_stats(records: Sequence[RequestRecord], slo: Slo) -> GroupStats:
    done = [r for r in records if completed(r)]
    tpots = [t for t in map(tpot_ms, done) if t is not None]
    return GroupStats(
        requests=len(records),
        completed=len(done),
        errors=sum(1 for r in records if failed(r)),
        cancelled=sum(1 for r in records if r.cancelled),
        ttft_s=dist([r.ttft_s for r in done if r.ttft_s is not None]),
        tpot_ms=dist(tpots),
        good=sum(1 for r in done if within_slo(r, slo)),
    )


def errors_by_status(records: Iterable[RequestRecord]) -> dict[str, int]:
    return {k: len(v) for k, v in group_by((r for r in records if failed(r)), error_key).items()}


def goodput_rps(records: Iterable[RequestRecord], slo: Slo, duration_s: float) -> float:
    """Requests within both SLOs per second of the run (0 for a run of no duration)."""
    if duration_s <= 0:
        return 0.0
    return sum(1 for r in records if within_slo(r, slo)) / duration_s


def counts(records: Sequence[RequestRecord], trace_requests: int, scheduled: int) -> RunCounts:
    return RunCounts(
        trace_requests=trace_requests, scheduled=scheduled, sent=len(records),
        completed=sum(1 for r in records if completed(r)),
        errors=sum(1 for r in records if failed(r)),
        cancelled=sum(1 for r in records if r.cancelled),
    )


# -- the generator's lag -------------------------------------------------------------


def lag_summary(lags_s: Sequence[float], threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS) -> LagSummary:
    ms = [x * 1000.0 for x in lags_s]
    return LagSummary(threshold_ms=threshold_ms, over_threshold=sum(1 for x in ms if x > threshold_ms),
                      max_ms=max(ms) if ms else None, p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99))


def fell_behind(lag: LagSummary) -> bool:
    """The generator fell behind its schedule: its p99 send lag passed the threshold. (A
    single late send, one in a hundred, is a hiccup of the machine, not a generator
    that cannot keep up; it still shows in ``over_threshold`` and ``max_ms``.)"""
    return lag.p99_ms is not None and lag.p99_ms > lag.threshold_ms


# -- replicas over time --------------------------------------------------------------


def replicas_in_use(records: Iterable[RequestRecord]) -> dict[str, list[tuple[float, int]]]:
    """Per model, a step function ``[(t_s, n), ...]`` of the replicas seen serving: a
    replica (``x-thaw-replica``) counts from the send of its first request to the end of
    its last. An estimate for runs without the controller's view: an idle replica that
    is still up does not count, and a replica counts through gaps between its requests."""
    spans: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if r.replica is None:
            continue
        end = r.end_s if r.end_s is not None else r.sent_s
        span = spans.setdefault(r.model, {}).setdefault(r.replica, [r.sent_s, end])
        span[0] = min(span[0], r.sent_s)
        span[1] = max(span[1], end)
    out: dict[str, list[tuple[float, int]]] = {}
    for model, by_replica in sorted(spans.items()):
        # +1 at each start, -1 at each end; at equal times, starts first.
        edges = sorted([(a, 0, 1) for a, _ in by_replica.values()] + [(b, 1, -1) for _, b in by_replica.values()])
        steps: list[tuple[float, int]] = []
        n = 0
        for t, _, d in edges:
            n += d
            if steps and steps[-1][0] == t:
                steps[-1] = (t, n)
            else:
                steps.append((t, n))
        out[model] = steps
    return out


# -- the report ----------------------------------------------------------------------


def build_report(run: RunInfo, records: Sequence[RequestRecord], slo: Slo, run_dir: str) -> Report:
    """`thaw load report`'s figures for one run directory's contents."""
    return Report(
        run_dir=run_dir,
        slo=slo,
        duration_s=run.duration_s,
        counts=counts(records, run.counts.trace_requests, run.counts.scheduled),
        goodput_rps=goodput_rps(records, slo, run.duration_s),
        overall=group_stats(records, slo),
        by_tier={k: group_stats(v, slo) for k, v in group_by(records, lambda r: r.tier or "none").items()},
        by_model={k: group_stats(v, slo) for k, v in group_by(records, lambda r: r.model).items()},
        errors_by_status=errors_by_status(records),
        generator_fell_behind=run.generator_fell_behind,
        lag=run.lag,
        replicas_source=run.replicas_source,
    )
