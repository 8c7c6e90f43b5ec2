"""Scheduled pre-warm (``models[].prewarm``): declared windows of known traffic in
which a model keeps at least some replicas. Pure: the schedule and the time in, replica
counts and window edges out; ``decide`` raises the model's floor with it and the
simulator wakes the model at each edge (``next_edge``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from thaw.config import Autoscaling, Prewarm
from thaw.cron import Cron, parse


@lru_cache(maxsize=1024)
def _cron(text: str) -> Cron:
    return parse(text)


def scheduled_replicas(windows: Sequence[Prewarm], now: float) -> int:
    """Replicas the schedule holds at ``now``: the most any open window asks. A window
    opens when its cron fires and stays open ``for_s``; of overlapping openings of one
    window the latest is open whenever an earlier one is, so it alone is checked."""
    held = 0
    for w in windows:
        fired = _cron(w.cron).last_fire(now)
        if fired is not None and now < fired + w.for_s:
            held = max(held, w.replicas)
    return held


def replica_floor(a: Autoscaling, windows: Sequence[Prewarm], now: float) -> int:
    """The replicas a model keeps at ``now`` whatever its traffic: ``min_replicas``,
    raised by an open window (within ``max_replicas``)."""
    held = scheduled_replicas(windows, now) if windows else 0
    return min(held, a.max_replicas) if held > a.min_replicas else a.min_replicas


def next_edge(windows: Sequence[Prewarm], after: float) -> float | None:
    """The first time strictly after ``after`` a window opens or closes (None: never)."""
    edges = []
    for w in windows:
        cron = _cron(w.cron)
        opens = cron.next_fire(after)
        # The first opening whose window closes after ``after``.
        closing = cron.next_fire(after - w.for_s)
        edges += [t for t in (opens, None if closing is None else closing + w.for_s) if t is not None]
    return min(edges, default=None)
