"""The learned keep-alive policy (``keep_alive: histogram``), adapted from the hybrid
histogram policy of Shahrad et al. ("Serverless in the Wild", USENIX ATC 2020) and the
ski-rental view of keep-alive. Pure: no I/O, no clock; time is passed in.

Per model, a histogram of its *idle intervals*: from the moment the model went idle (no
request in flight or queued) to its next request, with the intervals past ``range_s``
counted (and their total length kept) as out of range. Every model's histograms summed
(of models that share the bins), each model's counting as ``prior_model_weight``
intervals at most, are the **pooled prior**: a model with ``n`` intervals of its own
reads the other models' as ``max(prior_samples - n, prior_floor)`` more, so a model with
no history starts from what the fleet does, its own data takes over as it comes, and the
floor keeps some weight on gaps longer than it has had yet (each new longest gap would
otherwise be a cold start).

At each idle start the window is the one with the least expected cost per idle period,
over that blended distribution: idle replica-seconds, plus ``price`` for each cold
start, where ``price`` is ``cold_start_price_s`` (default the model's ``idle_grace_s``:
a fixed timeout of ``T`` is the best policy that knows nothing, at a price of ``T``)
times the tier's factor (a swap into an engine built ahead, or an adapter loaded into a
serving base, costs a fraction of a launch). The window:

- keeps the replica until ``keep_until_s`` (a bin edge, or forever when even the
  longest gaps are worth holding across), and
- optionally pre-warms: releases at once and asks for a replica back at
  ``prewarm_after_s`` (``prewarm_lead_s`` before a bin edge ``P``) when the gaps rarely
  end before ``P``.

With bins ``e_i = i * bin_s`` and prefix sums of the counts (``S0``) and of counts
times bin midpoints (``S1``) over ``T`` intervals in all, keeping until ``e_K`` and
pre-warming at ``r = e_P - lead`` costs ``A(K) + D(P)`` with
``A(K) = price * (T - S0[K]) + S1[K] + (T - S0[K]) * e_K`` and
``D(P) = price * S0[P] - S1[P] - r * (T - S0[P])`` (``D(0) = 0``: no pre-warm); the
two parts are independent but for ``P <= K``, so one pass with a running minimum of
``D`` finds the best window in O(bins).

Before the blend, the model's own intervals are smoothed (``smoothing``): each bin's
count is spread as a log-normal around the bin's midpoint, of width ``smoothing * s *
n**-smoothing_exponent`` (0.35) in natural-log units, ``s`` the spread of the logs of
its ``n`` intervals (a kernel density estimate: wide for a model whose few gaps run
from minutes to hours, narrow for one that calls like a clock, and narrowing with ``n``
faster than Silverman's ``n**-0.2``, which smears a cluster among spread gaps, such as
a cron between bursts, however many intervals show it), the part past ``range_s``
counted out of range at its conditional mean length. Without it, one gap
of 1,400 s among a sparse model's few is a spike that a pre-warm at 1,320 s is fitted
to; with it, the gap says "tens of minutes" and the model is let go.

``trust`` bounds the window, as learning-augmented ski rental does (Purohit, Svitkina
and Kumar, NeurIPS 2018): with ``t > 0`` the hold ends within ``[t * price, price / t]``
and a pre-warm comes no earlier than ``t * price`` (and holds at most ``price / t`` from
it), so a history that misleads (few gaps, or traffic that changed) costs at most
``1 + 1/t`` times the best on each gap held from the idle start, and ``t = 1`` is the
fixed timeout. The running minimum becomes a sliding one (a deque) over the pre-warms
that may pair with each ``K``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from thaw.config import Autoscaling, KeepAliveHistogram, Model, ThawConfig


def _bin_count(cfg: KeepAliveHistogram) -> int:
    return math.ceil(cfg.range_s / cfg.bin_s)


def _is_count(value: object) -> bool:
    # bool is an int subclass; True is not a count.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class IdleHistogram:
    """Counts of one model's idle intervals. Bins are interpreted with the current
    :class:`KeepAliveHistogram`; ``counts`` only grows as far as the longest interval
    seen, so an empty histogram is ``()``. ``out_of_range_s``: the out-of-range
    intervals' total length (what keeping a replica across them would cost)."""

    counts: tuple[int, ...] = ()
    out_of_range: int = 0
    out_of_range_s: float = 0.0
    # With ``periodic`` on: the same intervals by the slot of the period they began in
    # (each a histogram without slots of its own; () for a slot not reached yet).
    by_slot: tuple[IdleHistogram, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.counts, tuple) or not all(_is_count(c) for c in self.counts):
            raise ValueError(f"counts must be a tuple of non-negative integers, got {self.counts!r}")
        if not _is_count(self.out_of_range):
            raise ValueError(f"out_of_range must be a non-negative integer, got {self.out_of_range!r}")
        s = self.out_of_range_s
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < math.inf:
            raise ValueError(f"out_of_range_s must be a finite number >= 0, got {s!r}")
        if not isinstance(self.by_slot, tuple) or not all(
                isinstance(h, IdleHistogram) and not h.by_slot for h in self.by_slot):
            raise ValueError("by_slot must be a tuple of idle histograms without slots of their own")

    def total(self) -> int:
        """Every interval recorded, in range and out of range."""
        return sum(self.counts) + self.out_of_range

    def slot(self, i: int) -> IdleHistogram:
        """The intervals that began in slot ``i`` (empty when none has)."""
        return self.by_slot[i] if i < len(self.by_slot) else IdleHistogram()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counts": list(self.counts), "out_of_range": self.out_of_range,
                               "out_of_range_s": self.out_of_range_s}
        if self.by_slot:
            out["by_slot"] = [h.to_json() for h in self.by_slot]
        return out

    @classmethod
    def from_json(cls, data: Any, cfg: KeepAliveHistogram | None = None) -> IdleHistogram:
        """The histogram :meth:`to_json` wrote (``out_of_range_s`` and ``by_slot`` may
        be missing: 0 and none, as written before they were kept). Raises ValueError on
        anything else; with ``cfg``, also on more bins than ``range_s / bin_s`` or more
        slots than ``period_slots``."""
        if not isinstance(data, dict) or not {"counts", "out_of_range"} <= set(data) \
                or not set(data) <= {"counts", "out_of_range", "out_of_range_s", "by_slot"}:
            raise ValueError("an idle histogram is an object with 'counts', 'out_of_range' and optionally "
                             "'out_of_range_s' and 'by_slot'")
        counts = data["counts"]
        if not isinstance(counts, list):
            raise ValueError(f"counts must be a list, got {type(counts).__name__}")
        if cfg is not None and len(counts) > _bin_count(cfg):
            raise ValueError(f"{len(counts)} bins, more than range_s / bin_s = {_bin_count(cfg)}")
        slots = data.get("by_slot", [])
        if not isinstance(slots, list):  # slots of slots are refused as the histogram is built
            raise ValueError(f"by_slot must be a list, got {type(slots).__name__}")
        if cfg is not None and len(slots) > cfg.period_slots:
            raise ValueError(f"{len(slots)} slots, more than period_slots = {cfg.period_slots}")
        return cls(tuple(counts), data["out_of_range"], data.get("out_of_range_s", 0.0),
                   tuple(cls.from_json(h, cfg) for h in slots))


def histograms_to_json(cfg: ThawConfig, histograms: Mapping[str, IdleHistogram]) -> dict[str, Any]:
    """The models' histograms as the controller keeps them (``keepalive.json`` in its
    state): each with the bin width and the slots it was counted with."""
    return {m.name: {"bin_s": m.autoscaling.keep_alive_histogram.bin_s,
                     "slots": _slots(m.autoscaling.keep_alive_histogram),
                     "histogram": histograms[m.name].to_json()}
            for m in cfg.models if m.name in histograms}


def histograms_from_json(cfg: ThawConfig, body: Any) -> tuple[dict[str, IdleHistogram], dict[str, str]]:
    """What :func:`histograms_to_json` wrote, for ``cfg``'s models: their histograms,
    and why each one that could not be taken was dropped. Counts kept with another bin
    width mean other intervals (dropped); slots of another period (or none now) are
    dropped and the rest kept."""
    out: dict[str, IdleHistogram] = {}
    dropped: dict[str, str] = {}
    for m in cfg.models:
        entry = body.get(m.name) if isinstance(body, dict) else None
        if entry is None:
            continue
        hcfg = m.autoscaling.keep_alive_histogram
        if not isinstance(entry, dict):
            dropped[m.name] = f"not a histogram entry: {type(entry).__name__}"
            continue
        if entry.get("bin_s") != hcfg.bin_s:
            dropped[m.name] = f"counted with other bins than bin_s {hcfg.bin_s:g}"
            continue
        data = entry.get("histogram")
        if isinstance(data, dict) and entry.get("slots") != _slots(hcfg):
            data = {k: v for k, v in data.items() if k != "by_slot"}
        try:
            out[m.name] = IdleHistogram.from_json(data, hcfg)
        except ValueError as exc:
            dropped[m.name] = str(exc)
    return out, dropped


def _slots(cfg: KeepAliveHistogram) -> list[Any]:
    """What a histogram's slots mean: the period and how many slots it has."""
    return [cfg.periodic, cfg.period_slots]


def slot_of(at: float, cfg: KeepAliveHistogram) -> int | None:
    """The slot of the period (``periodic``) that the time ``at`` (Unix seconds, UTC)
    falls in; None when ``periodic`` is off."""
    period = cfg.period_s()
    if period is None:
        return None
    return min(math.floor((at % period) / period * cfg.period_slots), cfg.period_slots - 1)


def record_idle(h: IdleHistogram, idle_s: float, cfg: KeepAliveHistogram,
                began_at: float | None = None) -> IdleHistogram:
    """``h`` with one more observed idle interval (``>= range_s``: out of range), also
    in the slot of the period it began in (``began_at``) when ``periodic`` is on."""
    if not 0 <= idle_s < math.inf:  # also rejects NaN
        raise ValueError(f"an idle interval must be a finite number of seconds >= 0, got {idle_s!r}")
    by_slot = h.by_slot
    slot = None if began_at is None else slot_of(began_at, cfg)
    if slot is not None:
        by_slot = by_slot + (IdleHistogram(),) * max(0, slot + 1 - len(by_slot))
        by_slot = by_slot[:slot] + (record_idle(by_slot[slot], idle_s, cfg),) + by_slot[slot + 1:]
    if idle_s >= cfg.range_s:
        return IdleHistogram(h.counts, h.out_of_range + 1, h.out_of_range_s + idle_s, by_slot)
    # Clamped: float division can round an interval just under range_s up a bin.
    i = min(math.floor(idle_s / cfg.bin_s), _bin_count(cfg) - 1)
    counts = list(h.counts) + [0] * max(0, i + 1 - len(h.counts))
    counts[i] += 1
    return IdleHistogram(tuple(counts), h.out_of_range, h.out_of_range_s, by_slot)


def idle_interval(idle_since: float | None, arrival: float) -> float | None:
    """The idle interval a request arriving at ``arrival`` ends; None when the model
    was not idle. An arrival stamped before the idle start (clocks of activator and
    controller differ) counts as a zero-length interval."""
    if idle_since is None:
        return None
    return max(0.0, arrival - idle_since)


# -- the pooled prior ------------------------------------------------------------------

# Models pool their intervals with those that bin them alike and weigh a model alike:
# (bin_s, range_s, prior_model_weight, inf for none).
PoolKey = tuple[float, float, float]


def pool_key(cfg: KeepAliveHistogram) -> PoolKey:
    w = cfg.prior_model_weight
    return (cfg.bin_s, cfg.range_s, math.inf if w is None else w)


@dataclass(frozen=True)
class PooledCounts:
    """Idle intervals summed over models, each model's weighted (so counts are not
    whole): what :class:`IdleHistogram` holds for one model, read the same way."""

    counts: tuple[float, ...] = ()
    out_of_range: float = 0.0
    out_of_range_s: float = 0.0

    def total(self) -> float:
        return sum(self.counts) + self.out_of_range


def _share(h: IdleHistogram, key: PoolKey) -> float:
    """What each of ``h``'s intervals counts as in the pool: a model's intervals count
    as at most ``prior_model_weight`` in all."""
    n = h.total()
    return 1.0 if n <= key[2] else key[2] / n


def _add(a: PooledCounts, h: IdleHistogram | PooledCounts, scale: float) -> PooledCounts:
    """``a`` plus ``scale`` times ``h`` (a negative scale takes out what a positive one
    put in; the float residue is cut to zero)."""
    n = max(len(a.counts), len(h.counts))
    ca = a.counts + (0.0,) * (n - len(a.counts))
    cb = tuple(h.counts) + (0,) * (n - len(h.counts))
    counts = [x + scale * y for x, y in zip(ca, cb, strict=True)]
    counts = [c if c > 1e-9 else 0.0 for c in counts]
    while counts and counts[-1] == 0.0:
        counts.pop()
    oor = a.out_of_range + scale * h.out_of_range
    oor_s = a.out_of_range_s + scale * h.out_of_range_s
    return PooledCounts(tuple(counts), oor if oor > 1e-9 else 0.0, oor_s if oor > 1e-9 else 0.0)


@dataclass(frozen=True)
class IdlePools:
    """Every model's idle histogram summed, each weighted by :func:`_share`, per
    :data:`PoolKey`: derived from the models' own histograms (:func:`pooled`), never
    recorded apart from them."""

    pools: Mapping[PoolKey, PooledCounts] = field(default_factory=dict)
    # Each model's histogram (and its key) as summed: only changed ones are re-added.
    seen: Mapping[str, tuple[PoolKey, IdleHistogram]] = field(default_factory=dict)
    # When it was brought up to date: a window judged at ``at`` reads the pools as they
    # stood at the tick's start, whoever judges first (the controller, the simulator).
    at: float | None = None

    def prior(self, name: str, key: PoolKey) -> PooledCounts:
        """The other models' intervals for model ``name``: its pool less its own (as
        summed into it)."""
        total = self.pools.get(key, PooledCounts())
        own = self.seen.get(name)
        if own is None or own[0] != key or not own[1].total():
            return total
        return _add(total, own[1], -_share(own[1], key))


def pooled(pools: IdlePools, histograms: Mapping[str, tuple[PoolKey, IdleHistogram]], now: float) -> IdlePools:
    """``pools`` brought up to ``histograms`` (each model's key and histogram now): a
    model's histogram that is not the one summed is taken out and the new one added. A
    second call at the same ``now`` changes nothing."""
    if pools.at == now:
        return pools
    sums = dict(pools.pools)
    seen = dict(pools.seen)
    changed = False

    def put(key: PoolKey, h: IdleHistogram, sign: int) -> None:
        sums[key] = _add(sums.get(key, PooledCounts()), h, sign * _share(h, key))

    for name in [n for n in seen if n not in histograms]:
        key, old = seen.pop(name)
        put(key, old, -1)
        changed = True
    for name, (key, h) in histograms.items():
        was = seen.get(name)
        if was is not None and was[1] is h and was[0] == key:
            continue
        if was is not None and was[1].total():
            put(was[0], was[1], -1)
        if h.total():
            put(key, h, 1)
        seen[name] = (key, h)
        changed = True
    if not changed:
        return IdlePools(pools.pools, pools.seen, now)
    return IdlePools(sums, seen, now)


# -- windows ---------------------------------------------------------------------------

Tier = Literal["launch", "swap", "adapter"]


def price_tier(m: Model, cfg: ThawConfig) -> Tier:
    """How a cold start of ``m`` would most likely be served: an adapter into a serving
    base, a swap into an engine its pool builds ahead, else a launch or a standby."""
    if m.base is not None:
        return "adapter"
    if any(m.name in p.prebuild for p in cfg.pools if p.shape == m.shape):
        return "swap"
    return "launch"


def cold_start_price_s(a: Autoscaling, tier: Tier) -> float:
    """What one cold start of ``tier`` is worth, in idle replica-seconds."""
    cfg = a.keep_alive_histogram
    base = cfg.cold_start_price_s if cfg.cold_start_price_s is not None else a.idle_grace_s
    factor = {"launch": 1.0, "swap": cfg.swap_price_factor, "adapter": cfg.adapter_price_factor}[tier]
    return base * factor


@dataclass(frozen=True)
class KeepAliveWindow:
    """When to hold a replica for a model that went idle, relative to the idle start."""

    mode: Literal["fixed", "histogram"]
    reason: str
    # None: no pre-warm; the replica is kept from the idle start.
    prewarm_after_s: float | None
    # math.inf: kept until the next request.
    keep_until_s: float


def _fixed(autoscaling: Autoscaling, reason: str) -> KeepAliveWindow:
    return KeepAliveWindow("fixed", reason, None, autoscaling.idle_grace_s)


def _in_range(h: IdleHistogram | PooledCounts, cfg: KeepAliveHistogram, n_bins: int) -> tuple[list[float], float, float]:
    """``h``'s counts per bin up to ``range_s``, and its out-of-range count and seconds.
    Bins past ``range_s`` (left by a config whose range was longer) count as out of
    range, each at its lower edge."""
    counts = [float(c) for c in h.counts[:n_bins]] + [0.0] * max(0, n_bins - len(h.counts))
    past = list(enumerate(h.counts[n_bins:], start=n_bins))
    return (counts, h.out_of_range + sum(c for _, c in past),
            h.out_of_range_s + sum(c * i * cfg.bin_s for i, c in past))


# Counts per bin, out-of-range count and seconds, as floats (blended ones are weighted).
_Counts = tuple[list[float], float, float]


def _blend(own: _Counts, n_own: float, prior: _Counts,
           cfg: KeepAliveHistogram) -> tuple[_Counts, float]:
    """``own`` (of ``n_own`` intervals) with ``prior`` counted as
    ``max(prior_samples - n_own, prior_floor)`` intervals, and that weight."""
    counts, oor, oor_s = own
    p_counts, p_oor, p_oor_s = prior
    pt = sum(p_counts) + p_oor
    weight = max(cfg.prior_samples - n_own, cfg.prior_floor) if pt > 0 else 0.0
    if not weight:
        return own, 0.0
    f = weight / pt
    return ([c + f * pc for c, pc in zip(counts, p_counts, strict=True)], oor + f * p_oor, oor_s + f * p_oor_s), weight


SPREAD_PRIOR_N = 0.05


@lru_cache(maxsize=64)
def _bin_mids(n_bins: int, bin_s: float, range_s: float) -> tuple[float, ...]:
    """Where an interval of each bin is counted: the bin's midpoint, the last bin ending
    at ``range_s`` (partial where ``range_s`` is not a multiple of ``bin_s``)."""
    return tuple((i * bin_s + min((i + 1) * bin_s, range_s)) / 2 for i in range(n_bins))


@lru_cache(maxsize=256)
def _kernel(n_bins: int, bin_s: float, range_s: float, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each bin's count, the share that a log-normal of width ``sigma`` around the
    bin's midpoint puts in each bin (rows: from, columns: to), the share past
    ``range_s``, and the seconds that share stands for (its conditional mean length).
    The last bin ends at ``range_s``, as the window reads it, even when it is partial."""
    erf = np.vectorize(math.erf)
    upper = np.minimum(np.arange(1, n_bins + 1) * bin_s, range_s)
    mids = np.asarray(_bin_mids(n_bins, bin_s, range_s))
    cdf = 0.5 * (1 + erf((np.log(upper)[None, :] - np.log(mids)[:, None]) / (sigma * math.sqrt(2))))
    share = np.diff(np.concatenate([np.zeros((n_bins, 1)), cdf], axis=1), axis=1)
    past = 1 - cdf[:, -1]
    # E[X | X > R] of a log-normal with median m: m e^(s^2/2) Phi(s - z) / (1 - Phi(z)).
    z = (math.log(range_s) - np.log(mids)) / sigma
    tail = 0.5 * (1 + erf((sigma - z) / math.sqrt(2)))
    mean_past = mids * math.exp(sigma ** 2 / 2) * tail / np.maximum(past, 1e-300)
    seconds = past * np.maximum(mean_past, range_s)
    for a in (share, past, seconds):
        a.flags.writeable = False
    return share, past, seconds


def _log_spread(counts: list[float], oor: float, oor_s: float, cfg: KeepAliveHistogram) -> tuple[float, float]:
    """The count and the standard deviation of the natural log of the intervals (each
    at its bin's midpoint, the last bin ending at ``range_s``; the out-of-range ones at
    their mean length)."""
    logs = [math.log(m) for m in _bin_mids(len(counts), cfg.bin_s, cfg.range_s)]
    w = list(counts)
    if oor > 0:
        logs.append(math.log(oor_s / oor))
        w.append(oor)
    n = sum(w)
    mean = sum(c * x for c, x in zip(w, logs, strict=True)) / n
    var = sum(c * (x - mean) ** 2 for c, x in zip(w, logs, strict=True)) / n
    return n, math.sqrt(max(var, 0.0))


def _smoothed(own: _Counts, cfg: KeepAliveHistogram) -> _Counts:
    """A model's own intervals ``own``, smoothed as ``smoothing`` says (the
    out-of-range ones as they are)."""
    counts, oor, oor_s = own
    if not cfg.smoothing or not any(counts):
        return own
    n, sd = _log_spread(counts, oor, oor_s, cfg)
    # Their spread, with SPREAD_PRIOR_N intervals more of spread 1 (a few gaps have too
    # little spread to go by: one has none), times n ** -smoothing_exponent. Rounded,
    # so a few widths serve every model (a cached kernel each).
    spread = math.sqrt((n * sd ** 2 + SPREAD_PRIOR_N) / (n + SPREAD_PRIOR_N))
    sigma = round(cfg.smoothing * spread * n ** -cfg.smoothing_exponent, 2)
    if sigma <= 0:
        return own
    share, past, seconds = _kernel(len(counts), cfg.bin_s, cfg.range_s, sigma)
    v = np.asarray(counts)
    return [float(c) for c in v @ share], oor + float(v @ past), oor_s + float(v @ seconds)


def keep_alive_window(h: IdleHistogram, autoscaling: Autoscaling, prior: IdleHistogram | PooledCounts | None = None,
                      tier: Tier = "launch", idle_since: float | None = None) -> KeepAliveWindow:
    """The window for the model's idle period that began at ``idle_since``: the fixed
    ``idle_grace_s`` when so configured or while there is no interval to learn from (its
    own or ``prior``'s), else the least expected cost over its histogram blended with
    ``prior`` (and, with ``periodic`` on, over the intervals that began in the same slot
    of the period, blended with those)."""
    if autoscaling.keep_alive == "fixed":
        return _fixed(autoscaling, "fixed keep-alive (config)")
    cfg = autoscaling.keep_alive_histogram
    n_bins = _bin_count(cfg)
    pooled_counts: _Counts = _in_range(prior, cfg, n_bins) if prior is not None else ([0.0] * n_bins, 0.0, 0.0)
    n_own = h.total()
    (counts, oor, oor_s), weight = _blend(_smoothed(_in_range(h, cfg, n_bins), cfg), n_own, pooled_counts, cfg)
    slot = None if idle_since is None else slot_of(idle_since, cfg)
    basis = f"{n_own} own intervals, pooled prior x{weight:g}"
    if slot is not None:
        own_slot = h.slot(slot)
        n_slot = own_slot.total()
        (counts, oor, oor_s), slot_weight = _blend(_smoothed(_in_range(own_slot, cfg, n_bins), cfg), n_slot,
                                                   (counts, oor, oor_s), cfg)
        basis = f"{n_slot} intervals begun in slot {slot}, the model's x{slot_weight:g} ({basis})"
    total = sum(counts) + oor
    if total <= 0:
        return _fixed(autoscaling, "no idle interval yet, its own or pooled")
    price = cold_start_price_s(autoscaling, tier)
    # Bounds the window keeps to (``trust``; none at 0): no release, and no pre-warm
    # asked for, before ``low`` seconds idle, and no replica held past ``high`` seconds
    # (from its pre-warm, if any). At trust 1, no pre-warm at all: the fixed timeout.
    lead = cfg.prewarm_lead_s if cfg.prewarm and cfg.trust < 1 else math.inf
    low = cfg.trust * price
    high = price / cfg.trust if cfg.trust > 0 else math.inf
    s0 = s1 = 0.0  # prefix sums up to edge k
    mids = _bin_mids(n_bins, cfg.bin_s, cfg.range_s)
    best = (math.inf, 0, 0)  # (cost, K, P); K == n_bins + 1: forever
    # The pre-warms that may pair with a hold until the current edge, each as (D(P), P,
    # r), D rising from the first: its head is the best (a pre-warm only where D < 0).
    prewarms: deque[tuple[float, int, float]] = deque()
    for k in range(n_bins + 1):
        edge = min(k * cfg.bin_s, cfg.range_s)
        if k:
            r = edge - lead
            d = price * s0 - s1 - r * (total - s0)
            if r > 0 and r >= low and d < 0:
                while prewarms and prewarms[-1][0] >= d:
                    prewarms.pop()
                prewarms.append((d, k, r))
        while prewarms and edge - prewarms[0][2] > high:
            prewarms.popleft()
        a = price * (total - s0) + s1 + (total - s0) * edge
        if low <= edge <= high and a < best[0]:
            best = (a, k, 0)
        if prewarms and a + prewarms[0][0] < best[0]:
            best = (a + prewarms[0][0], k, prewarms[0][1])
        if k < n_bins:
            c = counts[k]
            s0 += c
            s1 += c * mids[k]
    if high >= cfg.range_s:  # past any gap the histogram holds: until the next request,
        # or (with trust) for ``high`` at most, taking the out-of-range gaps as of their
        # mean length
        held = oor_s if high == math.inf or oor <= 0 or oor_s / oor <= high else oor * (high + price)
        d_past, p_past = (prewarms[0][0], prewarms[0][1]) if prewarms and high == math.inf else (0.0, 0)
        if s1 + held + d_past < best[0]:
            best = (s1 + held + d_past, n_bins + 1, p_past)
    _, k, p = best
    if best[0] == math.inf:  # no bin edge within the bounds: hold for the least allowed
        keep = low
    elif k > n_bins:
        keep = high
    else:
        keep = min(k * cfg.bin_s, cfg.range_s)
    prewarm = min(p * cfg.bin_s, cfg.range_s) - cfg.prewarm_lead_s if p else None
    bounds = f"; trust {cfg.trust:g}: held {low:.0f}-{high:.0f} s" if cfg.trust > 0 else ""
    return KeepAliveWindow("histogram", f"{basis}; cold start {price:g} s ({tier}){bounds}", prewarm, keep)


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
