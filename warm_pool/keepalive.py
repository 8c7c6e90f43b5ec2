"""The hybrid histogram keep-alive policy (Shahrad et al., "Serverless in the Wild",
USENIX ATC 2020), adapted to LLM replicas. Pure: no I/O, no clock; time is passed in.

Per model, a histogram of *idle intervals*: from the moment the model went idle (no
request in flight or queued) to its next request. From it, at each idle start t0:

- pre-warm after ``head * (1 - margin)``: release the last replica at once and bring
  one back at ``t0 + prewarm_after_s``. When that is 0 (the head is in the first bin),
  there is no pre-warm: the replica is kept from t0;
- keep until ``tail * (1 + margin)``: past ``t0 + keep_until_s`` the model is at zero.

Bins are ``[i * bin_s, (i + 1) * bin_s)``, the last one cut at ``range_s``; an
interval ``>= range_s`` is out of range. Percentiles use nearest rank over the
in-range samples at bin resolution: the head is its bin's *lower* edge (pre-warm
early), the tail its bin's *upper* edge (keep alive long enough).

The policy falls back to the fixed ``idle_grace_s`` (no pre-warm) while the histogram
says little: too many intervals out of range (judged once there are ``min_samples``
of them), fewer than ``min_samples`` in range, or a flat pattern (the bin counts'
coefficient of variation below ``min_cv``, over every bin up to ``range_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from thaw.config import Autoscaling, KeepAliveHistogram


def _bin_count(cfg: KeepAliveHistogram) -> int:
    return math.ceil(cfg.range_s / cfg.bin_s)


def _is_count(value: object) -> bool:
    # bool is an int subclass; True is not a count.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class IdleHistogram:
    """Counts of one model's idle intervals. Bins are interpreted with the current
    :class:`KeepAliveHistogram`; ``counts`` only grows as far as the longest interval
    seen, so an empty histogram is ``()``."""

    counts: tuple[int, ...] = ()
    out_of_range: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.counts, tuple) or not all(_is_count(c) for c in self.counts):
            raise ValueError(f"counts must be a tuple of non-negative integers, got {self.counts!r}")
        if not _is_count(self.out_of_range):
            raise ValueError(f"out_of_range must be a non-negative integer, got {self.out_of_range!r}")

    def total(self) -> int:
        """Every interval recorded, in range and out of range."""
        return sum(self.counts) + self.out_of_range

    def to_json(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "out_of_range": self.out_of_range}

    @classmethod
    def from_json(cls, data: Any, cfg: KeepAliveHistogram | None = None) -> IdleHistogram:
        """The histogram :meth:`to_json` wrote. Raises ValueError on anything else; with
        ``cfg``, also on more bins than ``range_s / bin_s``."""
        if not isinstance(data, dict) or set(data) != {"counts", "out_of_range"}:
            raise ValueError("an idle histogram is an object with exactly 'counts' and 'out_of_range'")
        counts = data["counts"]
        if not isinstance(counts, list):
            raise ValueError(f"counts must be a list, got {type(counts).__name__}")
        if cfg is not None and len(counts) > _bin_count(cfg):
            raise ValueError(f"{len(counts)} bins, more than range_s / bin_s = {_bin_count(cfg)}")
        return cls(tuple(counts), data["out_of_range"])


def record_idle(h: IdleHistogram, idle_s: float, cfg: KeepAliveHistogram) -> IdleHistogram:
    """``h`` with one more observed idle interval (``>= range_s``: out of range)."""
    if not idle_s >= 0:  # also rejects NaN
        raise ValueError(f"an idle interval must be >= 0 s, got {idle_s!r}")
    if idle_s >= cfg.range_s:
        return IdleHistogram(h.counts, h.out_of_range + 1)
    # Clamped: float division can round an interval just under range_s up a bin.
    i = min(math.floor(idle_s / cfg.bin_s), _bin_count(cfg) - 1)
    counts = list(h.counts) + [0] * max(0, i + 1 - len(h.counts))
    counts[i] += 1
    return IdleHistogram(tuple(counts), h.out_of_range)


def idle_interval(idle_since: float | None, arrival: float) -> float | None:
    """The idle interval a request arriving at ``arrival`` ends; None when the model
    was not idle. An arrival stamped before the idle start (clocks of activator and
    controller differ) counts as a zero-length interval."""
    if idle_since is None:
        return None
    return max(0.0, arrival - idle_since)


@dataclass(frozen=True)
class KeepAliveWindow:
    """When to hold a replica for a model that went idle, relative to the idle start."""

    mode: Literal["fixed", "histogram"]
    reason: str
    # None: no pre-warm; the replica is kept from the idle start.
    prewarm_after_s: float | None
    keep_until_s: float


def _fixed(autoscaling: Autoscaling, reason: str) -> KeepAliveWindow:
    return KeepAliveWindow("fixed", reason, None, autoscaling.idle_grace_s)


def _percentile_bin(counts: tuple[int, ...], n: int, percentile: float) -> int:
    # Nearest rank, at least 1 so the 0th percentile is the first non-empty bin.
    rank = max(1, math.ceil(percentile * n / 100))
    cumulative = 0
    for i, c in enumerate(counts):
        cumulative += c
        if cumulative >= rank:
            return i
    raise AssertionError("rank beyond the sample count")  # rank <= n by construction


def keep_alive_window(h: IdleHistogram, autoscaling: Autoscaling) -> KeepAliveWindow:
    """The window for the model's next idle period: the fixed ``idle_grace_s`` when so
    configured or while the histogram is not representative, else the histogram's."""
    if autoscaling.keep_alive == "fixed":
        return _fixed(autoscaling, "fixed keep-alive (config)")
    cfg = autoscaling.keep_alive_histogram
    n_bins = _bin_count(cfg)
    # Bins past range_s (left by a config whose range was longer) are out of range now.
    counts = h.counts[:n_bins]
    in_range = sum(counts)
    total = h.total()
    out_share = (total - in_range) / total if total else 0.0
    if total >= cfg.min_samples and out_share > cfg.max_out_of_range_share:
        return _fixed(autoscaling, f"out-of-range share {out_share:.3g} > {cfg.max_out_of_range_share:g}")
    if in_range < cfg.min_samples:
        return _fixed(autoscaling, f"too few samples ({in_range} < {cfg.min_samples})")
    mean = in_range / n_bins
    # Empty bins up to range_s count: a pattern spread over hours is not one to follow.
    variance = max(0.0, sum(c * c for c in counts) / n_bins - mean * mean)
    cv = math.sqrt(variance) / mean
    if cv < cfg.min_cv:
        return _fixed(autoscaling, f"flat pattern (cv {cv:.3g} < {cfg.min_cv:g})")
    head = _percentile_bin(counts, in_range, cfg.head_percentile) * cfg.bin_s
    tail = min((_percentile_bin(counts, in_range, cfg.tail_percentile) + 1) * cfg.bin_s, cfg.range_s)
    prewarm = head * (1 - cfg.margin)
    return KeepAliveWindow("histogram", "histogram", prewarm if prewarm > 0 else None,
                           tail * (1 + cfg.margin))


@dataclass(frozen=True)
class KeepAliveDecision:
    """Whether the idle model should have a replica loaded now."""

    keep: bool
    # The replica is wanted because of pre-warming: the model was let go to zero and
    # one should be brought back (a standby assigned) before the next request.
    prewarm: bool
    reason: str


def keep_alive_decision(window: KeepAliveWindow, idle_since: float, now: float) -> KeepAliveDecision:
    """Apply ``window`` to a model idle since ``idle_since``. Without pre-warm a
    replica is kept while ``elapsed < keep_until_s``; with it, while
    ``prewarm_after_s <= elapsed < keep_until_s`` and not before. A ``now`` before
    ``idle_since`` (clock skew) counts as the idle start."""
    elapsed = max(0.0, now - idle_since)
    if elapsed >= window.keep_until_s:
        return KeepAliveDecision(False, False, f"idle {elapsed:g} s >= keep-alive {window.keep_until_s:g} s")
    if window.prewarm_after_s is None:
        return KeepAliveDecision(True, False, f"idle {elapsed:g} s < keep-alive {window.keep_until_s:g} s")
    if elapsed < window.prewarm_after_s:
        return KeepAliveDecision(False, False, f"idle {elapsed:g} s < pre-warm at {window.prewarm_after_s:g} s")
    return KeepAliveDecision(True, True, f"pre-warm: {window.prewarm_after_s:g} s <= idle {elapsed:g} s "
                                         f"< {window.keep_until_s:g} s")
