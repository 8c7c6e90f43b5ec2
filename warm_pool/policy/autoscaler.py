"""The replica autoscaler of one model, as small pure stages (after Ray Serve's
``autoscaling_policy.py`` and Knative's KPA):

    observe → window metrics → desired replicas → bounds → delays

Each stage is a function of values; time is passed in. The state that carries over
from one tick to the next (recent observations, the delays' clocks, panic mode) is a
frozen value that goes in and comes out, so a test steps through ticks by hand.

Scaling to zero is not decided here but by the keep-alive policy
(``warm_pool.policy.keepalive``): while it says keep, the lower bound is one replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

from thaw.config import Autoscaling

_T = TypeVar("_T")


# Per record class: whether it has a ``__post_init__`` (then evolve runs ``__init__``).
_HAS_POST_INIT: dict[type, bool] = {}


def evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the policy's small frozen records (every field an
    ``__init__`` argument), without its per-call field introspection nor, for a record
    with no ``__post_init__`` to run, its ``__init__`` (a frozen one sets each field
    through ``object.__setattr__``): the controller calls it for every model on every
    tick, the simulator millions of times a run."""
    cls = type(obj)
    post_init = _HAS_POST_INIT.get(cls)
    if post_init is None:
        post_init = _HAS_POST_INIT[cls] = hasattr(cls, "__post_init__")
    if post_init:
        return cls(**{**obj.__dict__, **changes})
    fields = obj.__dict__
    if not fields.keys() >= changes.keys():
        raise TypeError(f"{cls.__name__} has no field {sorted(changes.keys() - fields.keys())}")
    new = object.__new__(cls)
    new.__dict__.update(fields)
    new.__dict__.update(changes)
    return new


@dataclass(frozen=True)
class Observation:
    """One second of traffic: the demand (queued + in flight) the last tick in it saw,
    the arrivals, and the TTFTs of hot requests (in ascending order).

    Demand is a step function sampled by the controller's ticks: a second's value holds
    until the next observed second. So the windows' means depend neither on how often
    the controller ticks, nor on a tick skipped because nothing changed (the simulator
    skips those), nor on an extra tick (a demand signal wakes the controller)."""

    second: int
    demand: float = 0.0
    arrivals: int = 0
    ttfts: tuple[float, ...] = ()


@dataclass(frozen=True)
class WindowMetrics:
    stable_demand: float  # mean concurrency (queued + in flight) over the stable window
    panic_demand: float  # the same over the panic window
    arrivals_per_s: float  # over the stable window
    # Hot requests' TTFT p90 over the stable window (None: none seen, or the model has no
    # TTFT SLO, when nothing decides on it: ttft_p90 finds it for the gauge).
    ttft_p90_s: float | None


@dataclass(frozen=True)
class ScaleState:
    observations: tuple[Observation, ...] = ()
    # When a higher (lower) bounded count was first wanted, for the delays.
    up_since: float | None = None
    down_since: float | None = None
    # Panic mode holds until then (no scale-down while it does).
    panic_until: float = 0.0
    # TTFTs observed before this second were judged already (a TTFT-driven step is
    # followed by fresh evidence only).
    ttft_since: int = 0


@dataclass(frozen=True)
class ScaleResult:
    """What the autoscaler decided, and why: exported as gauges and event inputs."""

    current: int
    raw: int  # from demand and TTFT alone
    bounded: int  # within [floor, max_replicas] and the step limit
    target: int  # after the delays: what the replicas should be now
    panic: bool
    reason: str
    metrics: WindowMetrics


def observe(state: ScaleState, now: float, demand: int, arrivals: int, ttfts: tuple[float, ...],
            window_s: float) -> ScaleState:
    """Add this tick's traffic; forget what is older than ``window_s``, except the
    newest older second, whose demand holds into the window."""
    sec = math.floor(now)
    obs = list(state.observations)
    # Each second's TTFTs sorted: a window's p90 then sorts runs already in order.
    if obs and obs[-1].second == sec:
        last = obs[-1]
        obs[-1] = Observation(sec, float(demand), last.arrivals + arrivals,
                              tuple(sorted(last.ttfts + ttfts)) if ttfts else last.ttfts)
    else:
        obs.append(Observation(sec, float(demand), arrivals, tuple(sorted(ttfts))))
    oldest = sec - math.ceil(window_s)
    first_inside = next((i for i, o in enumerate(obs) if o.second > oldest), len(obs))
    return evolve(state, observations=tuple(obs[max(first_inside - 1, 0):]))


def mean_demand(observations: tuple[Observation, ...], now: float, window_s: float) -> float:
    """Demand averaged over the seconds ``(now - window_s, now]``, each second holding
    the last observed value (seconds before the first observation do not count)."""
    end = math.floor(now) + 1  # exclusive
    start = end - math.ceil(window_s)  # inclusive
    total, covered, until = 0.0, 0, end
    # Newest first: each observation holds until the next one (or the end).
    for o in reversed(observations):
        lo = o.second if o.second > start else start
        if until > lo:
            total += o.demand * (until - lo)
            covered += until - lo
        if o.second <= start:
            break
        until = o.second
    return total / covered if covered else 0.0


def window_metrics(state: ScaleState, now: float, a: Autoscaling) -> WindowMetrics:
    """Mean demand over both windows, arrivals per second and, for a model with a TTFT
    SLO, the TTFT p90 over the stable one (:func:`ttft_p90`; a busy model's window holds
    thousands of samples, and only the SLO's rule reads it)."""
    start = math.floor(now) - math.ceil(a.stable_window_s)
    stable = [o for o in state.observations if o.second > start]
    return WindowMetrics(mean_demand(state.observations, now, a.stable_window_s),
                         mean_demand(state.observations, now, a.panic_window_s),
                         sum(o.arrivals for o in stable) / a.stable_window_s,
                         ttft_p90(state, now, a) if a.ttft_slo_s is not None else None)


def ttft_p90(state: ScaleState, now: float, a: Autoscaling) -> float | None:
    """Hot requests' TTFT p90 over the stable window, of the samples since the last
    TTFT-driven step (None: none)."""
    start = math.floor(now) - math.ceil(a.stable_window_s)
    # Runs in order (each second's, sorted when observed): timsort merges them.
    ttfts = sorted(chain.from_iterable(o.ttfts for o in state.observations
                                       if o.second > start and o.second >= state.ttft_since))
    return ttfts[min(len(ttfts) - 1, math.ceil(0.9 * len(ttfts)) - 1)] if ttfts else None


def desired(m: WindowMetrics, current: int, a: Autoscaling, *, in_panic: bool = False,
            loading: int = 0) -> tuple[int, bool, bool, str]:
    """Replicas for this demand, whether the panic window triggers panic, whether a TTFT
    breach added one, and why.

    In panic (triggered now or still held), the panic window's demand counts too. A
    TTFT breach adds one replica when demand does not already ask for more, and only
    while no replica is loading (the last step has not taken effect yet).
    """
    raw = math.ceil(m.stable_demand / a.target_concurrency - 1e-9)
    reason = f"stable demand {m.stable_demand:.2f} / target {a.target_concurrency:g}"
    panic = current > 0 and m.panic_demand >= a.panic_threshold * current * a.target_concurrency
    if panic or in_panic:
        raw = max(raw, math.ceil(m.panic_demand / a.target_concurrency - 1e-9))
        reason = (f"panic: demand {m.panic_demand:.2f} over {a.panic_window_s:g} s >= "
                  f"{a.panic_threshold:g} x {current} x {a.target_concurrency:g}") if panic else \
            f"panic mode: demand {m.panic_demand:.2f} over {a.panic_window_s:g} s"
    breach = (a.ttft_slo_s is not None and m.ttft_p90_s is not None and m.ttft_p90_s > a.ttft_slo_s
              and current > 0 and loading == 0 and raw <= current)
    if breach:
        raw = current + 1
        reason = f"TTFT p90 {m.ttft_p90_s:.2f} s > SLO {a.ttft_slo_s:g} s"
    return raw, panic, breach, reason


def bounds(raw: int, current: int, floor: int, a: Autoscaling) -> int:
    """Within [floor, max_replicas], and one step up at most ``max_scale_up_rate`` x
    the current replicas (one more at least)."""
    step_cap = max(current + 1, math.floor(current * a.max_scale_up_rate))
    return max(floor, min(a.max_replicas, raw, step_cap) if raw > current else min(a.max_replicas, raw))


def steady_band(current: int, a: Autoscaling) -> tuple[float, float]:
    """The window demand ``(lower, upper]`` for which :func:`desired` and :func:`bounds`
    keep ``current`` replicas (at least ``max(min_replicas, 1)``) and the panic window
    cannot trigger panic: a model whose every observation lies in it scales neither
    way. Infinite where a bound holds whatever the demand (``min_replicas``,
    ``max_replicas``)."""
    tc = a.target_concurrency
    # Panic triggers at ``panic_threshold`` x current x target (also at max_replicas,
    # where it holds scale-down off for a stable window).
    upper = min(current * tc if current < a.max_replicas else math.inf,
                math.nextafter(a.panic_threshold * current * tc, -math.inf))
    lower = (current - 1) * tc if current > max(a.min_replicas, 1) else -math.inf
    return lower, upper


def autoscale(state: ScaleState, *, current: int, now: float, a: Autoscaling, demand_now: int,
              keep_warm: bool, loading: int = 0) -> tuple[ScaleResult, ScaleState]:
    """The replicas this model should have now.

    ``demand_now``: requests queued or in flight this tick. ``keep_warm``: the keep-alive
    policy wants a replica (within its window, or pre-warming). Without demand and
    without it, the model goes to ``min_replicas`` at once; with either, it keeps one
    at least, and the windows and delays decide the rest.
    """
    m = window_metrics(state, now, a)
    raw, panic, breach, reason = desired(m, current, a, in_panic=now < state.panic_until, loading=loading)
    if panic:
        state = evolve(state, panic_until=now + a.stable_window_s)
    if breach or loading:
        # Judge the next step on first tokens served by the whole set of replicas only:
        # not those from before the last step, nor those while a replica loads.
        state = evolve(state, ttft_since=math.floor(now) + 1)
    in_panic = now < state.panic_until
    warm = keep_warm or demand_now > 0
    floor = max(a.min_replicas, 1) if warm else a.min_replicas
    bounded = bounds(raw, current, floor, a)
    reset = evolve(state, up_since=None, down_since=None)

    def result(target: int, why: str, new: ScaleState) -> tuple[ScaleResult, ScaleState]:
        return ScaleResult(current, raw, bounded, target, in_panic, why, m), new

    if not warm:
        return result(a.min_replicas, "idle: keep-alive ended, nothing in flight", reset)
    if current < floor:
        # A request at zero, or a pre-warm: no window, no delay.
        why = "request at zero" if demand_now > 0 else "keep-alive: pre-warm"
        return result(max(bounded, floor), why, reset)
    if bounded > current:
        up_since = state.up_since if state.up_since is not None else now
        if in_panic or now - up_since >= a.upscale_delay_s:
            return result(bounded, reason, reset)
        return result(current, f"{reason}; up in {a.upscale_delay_s - (now - up_since):.1f} s",
                      evolve(state, up_since=up_since, down_since=None))
    if bounded < current:
        if in_panic:
            return result(current, "panic mode: no scale-down", reset)
        down_since = state.down_since if state.down_since is not None else now
        if now - down_since >= a.downscale_delay_s:
            # One step at a time, each after a delay of its own.
            return result(current - 1, f"{reason}; one step down", evolve(state, up_since=None, down_since=now))
        return result(current, f"{reason}; down in {a.downscale_delay_s - (now - down_since):.1f} s",
                      evolve(state, up_since=None, down_since=down_since))
    return result(current, reason, reset)
