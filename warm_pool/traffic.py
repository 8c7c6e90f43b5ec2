"""Activators' traffic as the controller sees it: their reports (queued and in-flight
requests per model, counters of arrivals, hot requests' TTFTs), demand signals for a
model at zero, and cold-start records; summed into each model's activity for the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from thaw.wire import ColdStartRecord
from warm_pool.policy.decide import ModelActivity

# A report older than this no longer counts (its activator stopped reporting).
REPORT_TTL_S = 10.0


@dataclass
class _Report:
    at: float
    models: dict[str, ModelActivity]


class Traffic:
    def __init__(self, *, clock: Callable[[], float], wake: Callable[[], None]) -> None:
        """``wake``: asks the loop to decide now (a request is waiting)."""
        self.clock = clock
        self._wake = wake
        self.reports: dict[str, _Report] = {}
        self.demand_at: dict[str, float] = {}
        self._arrivals_seen: dict[tuple[str, str], int] = {}
        self._activators: set[str] = set()  # every activator that reported to this controller
        self._new_arrivals: dict[str, int] = {}
        self._new_ttfts: dict[str, list[float]] = {}
        self.cold_starts: dict[str, ColdStartRecord] = {}
        # Models found serving at adoption, and when (see adopted()).
        self.adopted_serving: dict[str, float] = {}

    def report(self, activator_id: str, models: dict[str, ModelActivity], arrivals: dict[str, int] | None = None,
               ttfts: dict[str, list[float]] | None = None) -> None:
        """An activator's traffic. ``arrivals`` are its counters (requests accepted since
        it started): the differences since its last report are new arrivals."""
        self.reports[activator_id] = _Report(self.clock(), models)
        known = activator_id in self._activators
        self._activators.add(activator_id)
        for name, count in (arrivals or {}).items():
            seen = self._arrivals_seen.get((activator_id, name))
            if seen is None and known:
                # Its first report of a model (an activator leaves out the models it never
                # had a request for): every arrival it counts is new.
                seen = 0
            # The first report from an activator sets the baseline: after a controller
            # restart its counter holds everything since it started, not new arrivals.
            # A counter that went down: the activator restarted and counts from zero.
            new = 0 if seen is None else count - seen if count >= seen else count
            self._arrivals_seen[(activator_id, name)] = count
            self._new_arrivals[name] = self._new_arrivals.get(name, 0) + new
        for name, samples in (ttfts or {}).items():
            self._new_ttfts.setdefault(name, []).extend(samples)
        if any(a.queued for a in models.values()):
            self._wake()

    def take(self, activity: dict[str, ModelActivity]) -> dict[str, ModelActivity]:
        """``activity`` with the arrivals and TTFTs reported since the last tick (taken)."""
        out = dict(activity)
        for name in set(self._new_arrivals) | set(self._new_ttfts):
            cur = out.get(name, ModelActivity())
            out[name] = replace(cur, arrivals=self._new_arrivals.get(name, 0),
                                ttfts=tuple(self._new_ttfts.get(name, ())))
        self._new_arrivals.clear()
        self._new_ttfts.clear()
        return out

    def demand(self, model: str) -> None:
        """A request is waiting for ``model`` at zero: decide now, not on the next tick."""
        self.demand_at[model] = self.clock()
        self._wake()

    def record_cold_start(self, record: ColdStartRecord) -> None:
        self.cold_starts[record.model] = record

    def adopted(self, serving: Iterable[str], now: float) -> None:
        """Models found serving when the fleet was adopted: each counts as used just now,
        so its idle grace starts at the adoption and no replica is released because the
        controller restarted (the activators' reports that say otherwise may not have
        arrived yet)."""
        for model in serving:
            self.adopted_serving[model] = now

    def activity(self, now: float) -> dict[str, ModelActivity]:
        """Each model's traffic summed over the activators that reported lately, with
        demand signals and models adopted serving."""
        out: dict[str, ModelActivity] = {}
        for rid, rep in list(self.reports.items()):
            if now - rep.at > REPORT_TTL_S:
                del self.reports[rid]
                continue
            for name, a in rep.models.items():
                cur = out.get(name)
                if cur is None:
                    # One activator's word as it came (a model is mostly reported by one):
                    # no new object each tick for each model every report names (every
                    # model it ever had a request for), and a tick that compares with the
                    # last one finds it the same object.
                    out[name] = a
                    continue
                last = max(filter(None, (cur.last_request_at, a.last_request_at)), default=None)
                out[name] = ModelActivity(cur.queued + a.queued, cur.in_flight + a.in_flight, last)
        for name, at in self.adopted_serving.items():
            cur = out.get(name, ModelActivity())
            last = max(filter(None, (cur.last_request_at, at)), default=None)
            out[name] = ModelActivity(cur.queued, cur.in_flight, last)
        for name, at in list(self.demand_at.items()):
            if now - at > REPORT_TTL_S:
                # As old as a report that no longer counts: the activators' reports have
                # said since what it said (a request came), or nobody does. Kept, every
                # model ever signalled would cost each tick (1,000 after a burst).
                del self.demand_at[name]
                continue
            cur = out.get(name, ModelActivity())
            # A demand signal counts as one queued request until a report covers it.
            recent = now - at < 2.0 and not cur.queued
            last = max(filter(None, (cur.last_request_at, at)), default=None)
            out[name] = ModelActivity(cur.queued + (1 if recent else 0), cur.in_flight, last)
        return out

    def activators(self, now: float) -> int:
        """Activators that reported lately (at least 1: the one asking)."""
        return max(1, sum(1 for r in self.reports.values() if now - r.at <= REPORT_TTL_S))
