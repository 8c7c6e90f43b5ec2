"""When judging a model again cannot change anything: the rule that lets a tick judge
only the models whose decision can change (the controller's tick at thousands of
models, and the simulator's fast mode), and the times at which a settled model must be
looked at again although none of its inputs changed.

A model is *settled* when ``decide`` would, with the same traffic, give no decision for
it and leave it a state the next judgement would not differ on: its autoscaler is at
rest (no step pending, no panic), it is not backing off, no pre-warm window holds it
up, its replicas are what its last judgement wanted, and its demand stays inside the
autoscaler's steady band (or it is idle and let go, at its floor). What still changes a
settled model without any new input is time: its keep-alive window opening or closing
(:func:`wake_times`) and a pre-warm window's edges (``warm_pool.policy.prewarm.next_edge``).
"""

from __future__ import annotations

import math

from thaw.config import Model
from warm_pool.policy.autoscaler import steady_band
from warm_pool.policy.decide import ModelState
from warm_pool.policy.keepalive import keep_alive_decision
from warm_pool.policy.prewarm import scheduled_replicas


def keeps_warm(ms: ModelState, now: float) -> bool:
    """The keep-alive policy's word for an idle model now (a model never judged has no
    window and is not idle; one evicted in this idle period is let go)."""
    window = ms.keep_alive
    if ms.idle_since is None or window is None or ms.evicted:
        return False
    return keep_alive_decision(window, ms.idle_since, now).keep


def settled(ms: ModelState, m: Model, *, serving: int, demand: int, now: float, shape_changed: bool,
            band_for: int | None) -> tuple[bool, int | None]:
    """Whether judging ``m`` at ``now`` cannot give a decision, nor a state the next
    judgement would differ on, until its traffic, its workers or a wake time changes that.

    ``serving``: its replicas loading or ready; ``demand``: its requests queued and in
    flight (a base's with its adapters'); ``shape_changed``: a worker of its shape changed
    since its last judgement (a model waiting at zero for a standby is judged again then).
    ``band_for``: the replica count for which every observation in its windows was last
    found inside the steady band (a cache of that scan: None when not known); returned
    updated with the answer."""
    a = m.autoscaling
    sc = ms.scale
    if sc.up_since is not None or sc.down_since is not None or now < sc.panic_until:
        return False, band_for
    if m.prewarm and scheduled_replicas(m.prewarm, now) > a.min_replicas:
        return False, band_for  # a pre-warm window holds it up: judged every tick
    if ms.failures and now < ms.backoff_until:
        return False, band_for
    last = ms.last_scale
    if last is None:
        return False, band_for
    if last.target != serving:
        # A request at zero found no standby: nothing changes for it until a worker of
        # its shape does (the pools count the launch it waits for meanwhile).
        return serving == 0 and demand > 0 and not shape_changed, band_for
    if not (demand > 0 or keeps_warm(ms, now)):
        # Idle and let go: the target is min_replicas, whatever the windows say.
        return serving == a.min_replicas, band_for
    if serving < max(a.min_replicas, 1):
        return False, band_for
    if a.ttft_slo_s is not None and any(o.ttfts for o in sc.observations):
        return False, band_for
    # The raw count stays at the current one while every demand value the windows can
    # hold is in the autoscaler's steady band: no step up or down, no panic.
    lower, upper = steady_band(serving, a)
    if not lower < demand <= upper:
        return False, None
    if band_for != serving:
        if not all(lower < o.demand <= upper for o in sc.observations):
            return False, band_for
        band_for = serving
    return True, band_for


def wake_times(ms: ModelState, now: float) -> tuple[float, ...]:
    """When an idle model's keep-alive window opens (a pre-warm back) or closes, after
    ``now`` (a window kept until the next request has no end to wake at)."""
    window = ms.keep_alive
    if ms.idle_since is None or window is None:
        return ()
    return tuple(ms.idle_since + after for after in (window.prewarm_after_s, window.keep_until_s)
                 if after is not None and math.isfinite(after) and ms.idle_since + after > now)
