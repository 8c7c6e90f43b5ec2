"""The standby sizer: how many standby workers a shape keeps, from its cold-start demand.

Pure, like ``warm_pool.policy.decide``: demand, the pool's config and ``now`` go in with the
last ``SizerState``; a ``StandbyTarget`` (data, for the policy and its metrics) and the
next state come out. A test steps through ticks by hand.

Demand is the number of standbys that cold starts use up while a replacement boots:
``raw = cold_starts_per_min * boot_s / 60 + standby_margin`` standbys, and the wanted
count is ``ceil(raw)`` clamped to ``[standby_min, standby_max]``.

Hysteresis, with the watermarks in units of raw demand (both are whole numbers, so
"raw <= lower" is the same as "ceil(raw) < target"):
- upper watermark = target: demand above it raises the target at once (a cold start
  that finds no standby waits for a whole boot);
- lower watermark = target - 1: demand at or below it, i.e. any demand that needs
  fewer standbys, starts the hold. Demand inside the band (target - 1, target] changes
  nothing, and neither does a dip below it that ends within ``standby_hold_s``;
- after ``standby_hold_s`` continuously below, the target falls to the highest wanted
  count seen during the hold: the level demand has stayed at or under for the whole
  hold (Knative's max over a window). Falling to the latest value instead would drop a
  target that demand came within one of just before, only to rise again on the next
  tick; one step per hold would keep capacity that nothing asked for over several holds.

The stopped tier (EC2): ``plan_tiers`` turns the running target into starts of stopped
instances (before any fresh launch), stops instead of terminations, and the launches or
terminations that keep ``stopped_standby_min..stopped_standby_max`` stopped instances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from thaw.config import Pool

# A product that should be a whole number can land a hair above it in binary floating
# point (2.2 x 180 / 60 + 0.4 = 7.000000000000001); ceil() would then ask for one more.
CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class SizerState:
    """The sizer's memory between ticks."""

    target: int | None = None          # None: not initialised (starts at standby_min)
    below_since: float | None = None   # when the raw demand first went below the lower watermark
    below_peak: int | None = None      # highest wanted count seen since below_since


@dataclass(frozen=True)
class StandbyTarget:
    """One tick's decision, with what it was made from (for metrics and events)."""

    target: int
    raw: float  # the demand in standbys, before rounding up and clamping
    lower_watermark: int
    upper_watermark: int
    # rise | steady | hold | fall | bounds (the pool's bounds moved the target)
    reason: str


def _nonneg(x: float) -> float:
    # NaN and negative inputs (a clock step, a bad metric) mean no demand, never an error.
    return x if x > 0 else 0.0


def wanted_standby(raw: float, pool: Pool) -> int:
    """``ceil(raw)`` clamped to ``[standby_min, standby_max]`` (without hysteresis)."""
    capped = min(raw, float(pool.standby_max))  # also keeps ceil() away from inf
    return max(pool.standby_min, min(pool.standby_max, math.ceil(capped - CEIL_SLACK)))


def cold_start_rate(times: Sequence[float], now: float, window_s: float) -> float:
    """Cold starts per minute over the window ``(now - window_s, now]``.

    Times after ``now`` (another host's clock ahead of ours) are not counted yet.
    """
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s!r}")
    n = sum(1 for t in times if now - window_s < t <= now)
    return n * 60.0 / window_s


def size_standby(
    state: SizerState, *, cold_starts_per_min: float, boot_s: float, pool: Pool, now: float
) -> tuple[StandbyTarget, SizerState]:
    """The shape's standby target for this tick, and the state for the next.

    ``boot_s``: how long a new standby takes to appear for this shape (measured or
    configured). A target from before a config change is first moved into the pool's
    bounds (reason ``bounds``), and any hold starts over.
    """
    raw = _nonneg(cold_starts_per_min) * _nonneg(boot_s) / 60.0 + pool.standby_margin
    wanted = wanted_standby(raw, pool)
    previous = pool.standby_min if state.target is None else state.target
    current = max(pool.standby_min, min(pool.standby_max, previous))
    # A hold belongs to the target it was measured against.
    holding = state.below_since is not None and current == previous

    if wanted > current:
        target, reason, nxt = wanted, "rise", SizerState(wanted)
    elif wanted == current:
        target, reason, nxt = current, "steady", SizerState(current)
    else:
        since = state.below_since if holding and state.below_since is not None else now
        peak = max(wanted, state.below_peak or 0) if holding else wanted
        if now - since >= pool.standby_hold_s:
            target, reason, nxt = peak, "fall", SizerState(peak)
        else:
            target, reason, nxt = current, "hold", SizerState(current, since, peak)
    if current != previous and reason in ("steady", "hold"):
        reason = "bounds"
    # The band around the target returned: the demand that would change it next.
    return StandbyTarget(target, raw, target - 1, target, reason), nxt


@dataclass(frozen=True)
class TierPlan:
    """What to do with running and stopped standby instances of one EC2 pool."""

    start_stopped: int      # stopped instances to start (used first, before any launch)
    launch: int             # fresh launches for the running standby
    stop_running: int       # excess running standbys to stop (kept as stopped standby while below stopped_standby_max)
    terminate_running: int  # excess running standbys beyond what the stopped tier wants
    launch_to_stop: int     # new instances to launch and then stop, to reach stopped_standby_min
    terminate_stopped: int  # stopped ones beyond stopped_standby_max


def plan_tiers(target: int, running_standby: int, stopped: int, pool: Pool) -> TierPlan:
    """Move the running standby to ``target`` through the stopped tier.

    ``running_standby`` counts the ones on their way (launching, starting); ``target``
    is the sizer's, already bounded by the budget (``warm_pool.policy.budget``). A short
    running standby is filled from stopped instances first (a start skips the boot
    and the image pull), then by launches. An excess one is stopped while the stopped
    tier has room below ``stopped_standby_max``, and only then terminated. The stopped
    tier is then refilled to ``stopped_standby_min`` (launched, then stopped once
    booted: it costs compute until then, which the caller's caps must allow) or trimmed
    to ``stopped_standby_max``. Pools that cannot stop (local) have a maximum of 0, so
    this reduces to launch or terminate.
    """
    target, running, stopped = max(target, 0), max(running_standby, 0), max(stopped, 0)
    short = target - running
    start = min(max(short, 0), stopped)
    launch = max(short, 0) - start
    excess = max(-short, 0)
    stop = min(excess, max(pool.stopped_standby_max - stopped, 0))
    left = stopped - start + stop
    return TierPlan(
        start_stopped=start,
        launch=launch,
        stop_running=stop,
        terminate_running=excess - stop,
        launch_to_stop=max(pool.stopped_standby_min - left, 0),
        terminate_stopped=max(left - pool.stopped_standby_max, 0),
    )
