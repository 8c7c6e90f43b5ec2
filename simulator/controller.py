"""The controller's ticks in the simulation: which models to judge (all of them in
``exact`` mode; by default only those whose decision can change), ``decide`` itself on
a snapshot of the simulated fleet, and the deadlines that wake a model or the pools."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping

from simulator.changes import Changes
from simulator.clock import INF
from simulator.effects import Effects
from simulator.fleet import Fleet
from simulator.traffic import SimModel
from thaw.config import ThawConfig
from warm_pool.policy.decide import (
    COLD_START_WINDOW_S,
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    decide,
    idle_pools,
    track,
)
from warm_pool.policy.decisions import Decision
from warm_pool.policy.evict import CAPACITY_GRACE_S
from warm_pool.policy.keepalive import IdleHistogram, IdlePools
from warm_pool.policy.prewarm import next_edge
from warm_pool.policy.settle import settled, wake_times


def _activity(m: SimModel) -> ModelActivity:
    return ModelActivity(m.queued, m.in_flight, m.last_request_at, m.arrivals, tuple(m.hot_ttfts))


def _tracked_activity(m: SimModel) -> ModelActivity:
    """``m``'s traffic as ``decide`` counts it: a base's with its adapters' added (in
    config order, as ``decide`` adds them)."""
    act = _activity(m)
    for a in m.adapters:
        act = act.plus(_activity(a))
    return act


def _demand(m: SimModel) -> int:
    """Requests queued and in flight for ``m``: a base's with its adapters'."""
    return sum(x.queued + x.in_flight for x in m.group) if m.adapters else m.queued + m.in_flight


class Controller:
    """The warm-pool controller over the simulated fleet: its policy state, the models
    it watches, its wake-ups, and the decisions it hands to :class:`Effects`."""

    def __init__(self, cfg: ThawConfig, models: list[SimModel], fleet: Fleet, changes: Changes, effects: Effects,
                 *, tick_s: float, exact: bool, classes: dict[str, str], engine_bytes: dict[str, int],
                 record: bool, histograms: Mapping[str, IdleHistogram] | None,
                 refuse: Callable[[SimModel], None]) -> None:
        """``refuse``: answers a model's waiting requests 503 at once (its pool is full)."""
        self.cfg, self.models, self.fleet, self.changes, self.effects = cfg, models, fleet, changes, effects
        self.refuse = refuse
        self.tick_s, self.exact, self.record = tick_s, exact, record
        self.classes, self.engine_bytes = classes, engine_bytes
        # The policy's state: what decide() returned, and the models' states the
        # simulator has since moved on by bookkeeping alone (its own dict: a state
        # handed to decide() is never changed afterwards).
        self.state = PolicyState(epoch="sim")
        # Keep-alive histograms learnt before the trace (as a controller loads its own
        # after a restart): the models start from them instead of from nothing.
        # Every model is known from the start (as a controller's first tick sees its
        # config): the wait for its first request is its first idle interval.
        loaded = histograms or {}
        self.ms: dict[str, ModelState] = {m.name: ModelState(idle_histogram=loaded.get(m.name, IdleHistogram()),
                                                             seen_since=0.0) for m in cfg.models}
        # The keep-alive policy's pooled prior as this tick started (what decide() reads
        # too); kept up only when some model learns its keep-alive.
        self.learns = any(m.autoscaling.keep_alive == "histogram" for m in cfg.models)
        self.idle_pools = IdlePools()
        self.pool_deadlines: set[float] = set()
        self.watch: set[SimModel] = set()  # judged every tick until settled
        # At zero with requests waiting and no standby: judged again when a worker of
        # its shape changes or the pools are judged (which count what it waits for).
        self.waiting: set[SimModel] = set()
        self.changed_now: set[str] = set()
        # Shapes a model of which has new traffic or must be judged this tick: one going
        # idle may be evicted for a model waiting at zero in its full pool, which is then
        # judged again (policy.evict).
        self.stirred: set[str] = set()
        self.deadlines = effects.deadlines  # (when, model idx or -1: pools)
        self.next_grid = 0
        self.decisions: list[tuple[float, Decision]] = []
        self.ticks = 0
        self.judged = 0
        # The first tick judges every model (min_replicas, pre-warming).
        changes.dirty.update(models)
        # Scheduled pre-warm: each window's opening and closing wakes its model. The
        # clock is the cron's: t = 0 is 1970-01-01 00:00 UTC, a Thursday.
        for sm in models:
            if sm.cfg.prewarm:
                self._schedule_edge(sm, -1.0)  # from the start: an edge at 0 too

    # -- when to tick -------------------------------------------------------------------

    def next_tick(self, now: float) -> float:
        """When the next tick is due (INF: none needed until something happens)."""
        grid = self.next_grid * self.tick_s
        if self.exact:
            return grid
        ch = self.changes
        if ch.dirty or self.watch or ch.pools_dirty or ch.touched:
            return self.tick_due(now)
        if self.deadlines:
            return max(grid, math.ceil(self.deadlines[0][0] / self.tick_s - 1e-9) * self.tick_s)
        return INF

    def tick_due(self, at: float) -> float:
        """The tick that sees what happens at ``at`` (the default mode's): the first grid
        point at or after it, never before the next grid tick."""
        g = math.ceil(at / self.tick_s - 1e-9) * self.tick_s
        # Never a tick before the event (one a hair past a grid point is the next tick's,
        # as the controller's ticks see it).
        return max(self.next_grid * self.tick_s, g if g >= at else g + self.tick_s)

    def grid_tick(self, t: float) -> None:
        """The tick due at ``t`` on the controller's grid; the next one is a grid step on."""
        self.next_grid = round(t / self.tick_s) + 1
        self.tick(t)

    # -- a tick ---------------------------------------------------------------------------

    def tick(self, t: float) -> None:
        self.ticks += 1
        ch = self.changes
        while self.deadlines and self.deadlines[0][0] <= t:
            when, idx = heapq.heappop(self.deadlines)
            if idx < 0:
                self.pool_deadlines.discard(when)
                ch.pools_dirty = True
            elif when in self.models[idx].deadline_times:
                ch.dirty.add(self.models[idx])
            elif when == self.models[idx].schedule_next:
                ch.dirty.add(self.models[idx])
                self._schedule_edge(self.models[idx], when)
        dirty, ch.dirty = ch.dirty, set()
        self.changed_now, ch.shapes_changed = ch.shapes_changed, set()
        self.stirred = {m.cfg.shape for m in dirty | ch.touched} if self.waiting else set()
        if self.learns:
            self.idle_pools = idle_pools(self.ms, self.cfg, self.idle_pools, t)
        judge = self.models if self.exact else self._to_judge(dirty, t)
        if judge or ch.pools_dirty:
            self._judge(judge, t)

    def _to_judge(self, dirty: set[SimModel], t: float) -> list[SimModel]:
        """The fast mode's choice: the models (with their groups) whose decision can
        change now; the others only get the tick's bookkeeping."""
        judge: list[SimModel] = []
        seen: set[int] = set()
        touched = self.changes.touched
        for m in sorted(dirty | self.watch | touched | self.waiting, key=lambda m: m.idx):
            # A base and its adapters as one: all judged when any one must be.
            group = m.group
            if len(group) > 1:
                if group[0].idx in seen:
                    continue
                seen.add(group[0].idx)
            if any(x in dirty for x in group):
                judge.extend(group)
                continue
            busy = any(x in touched for x in group)
            states = []
            for x in group:
                # A base's traffic includes its adapters'.
                tracked = x in touched or (busy and bool(x.adapters))
                ms = self.ms.get(x.name) or ModelState()
                if tracked:
                    # This tick's bookkeeping first: judged as it would leave the model.
                    ms = track(ms, _tracked_activity(x), x.cfg, self.cfg, t, self.idle_pools)
                states.append((x, ms, tracked))
            if not all(self._settled(x, ms, t) for x, ms, _ in states):
                judge.extend(group)  # decide() does the bookkeeping itself
                continue
            for x, ms, tracked in states:
                self._keep_settled(x, ms, t, tracked)
        if seen:
            judge.sort(key=lambda m: m.idx)
        return judge

    def _judge(self, judge: list[SimModel], t: float) -> None:
        ch = self.changes
        activity = {m.name: _activity(m) for m in judge}
        snap = Snapshot(self.fleet.current_views(), activity, model_classes=self.classes,
                        engine_bytes=self.engine_bytes)
        only = None if self.exact else {m.name for m in judge}
        pools = True if self.exact else ch.pools_dirty
        ch.pools_dirty = False
        state = PolicyState(models=dict(self.ms), pools=self.state.pools, assignments=self.state.assignments,
                            epoch=self.state.epoch, idle_pools=self.idle_pools)
        decisions, self.state = decide(snap, state, self.cfg, t, only=only, pools=pools)
        self.ms = dict(self.state.models)
        self.idle_pools = self.state.idle_pools
        self.judged += len(judge)
        for m in judge:
            self._reported(m)
        for d in decisions:
            if self.record:
                self.decisions.append((t, d))
            self.effects.carry_out(d, t)
        for m in judge:
            # Its pool can give it no instance: the activators answer its requests 503
            # (an adapter waits on its base's engine).
            held = self.ms.get(m.group[0].name)
            m.at_capacity = held is not None and held.at_capacity is not None
            if m.at_capacity and m.queued:
                self.refuse(m)
        for m in judge:
            if m.cold_open and m.cold_tier is None and not m.serving:
                # No standby took it: the cold start waits for an instance to boot.
                m.cold_tier = "launch"
            if self.exact:
                continue
            ms = self.ms.get(m.name) or ModelState()
            if self._settled(m, ms, t):
                self.watch.discard(m)
            else:
                self.watch.add(m)
            self._note_waiting(m, ms)
            self._deadlines_for(m, ms, t)
        if not self.exact:
            self._pool_deadlines()
            if decisions:
                # Their effects (assignments, releases) are inputs of the next tick.
                ch.pools_dirty = True

    # -- whether a model needs judging ------------------------------------------------------

    def _reported(self, m: SimModel) -> None:
        m.arrivals = 0
        if m.hot_ttfts:
            m.hot_ttfts = []
        self.changes.touched.discard(m)

    def _settled(self, m: SimModel, ms: ModelState, t: float) -> bool:
        """``warm_pool.policy.settle.settled`` for ``m`` as the simulated fleet has it: a
        model waiting at zero is judged again when a worker of its shape changes, or a
        model of its shape moves (one gone idle may be evicted for it)."""
        shape = m.cfg.shape
        ok, m.band_for = settled(ms, m.cfg, serving=m.serving, demand=_demand(m), now=t,
                                 shape_changed=shape in self.changed_now or shape in self.stirred,
                                 band_for=m.band_for)
        return ok

    def _keep_settled(self, m: SimModel, ms: ModelState, t: float, tracked: bool) -> None:
        """Not judged this tick: keep the bookkeeping ``track`` did for it (``tracked``:
        it did some)."""
        self.watch.discard(m)
        self._note_waiting(m, ms)
        if tracked:
            self.ms[m.name] = ms
            self._reported(m)
            self._deadlines_for(m, ms, t)

    def _note_waiting(self, m: SimModel, ms: ModelState) -> None:
        if ms.last_scale is not None and ms.last_scale.target > m.serving:
            self.waiting.add(m)
        else:
            self.waiting.discard(m)

    # -- wake-ups ---------------------------------------------------------------------------

    def _deadlines_for(self, m: SimModel, ms: ModelState, t: float) -> None:
        """Wake the model when its keep-alive window opens or closes, or, waiting at zero,
        when its grace before a refusal ends (policy.evict)."""
        if ms.idle_since is None or _demand(m):
            # Busy: the keep-alive window does not apply until it is idle again.
            refusal = None if ms.at_zero_since is None or ms.at_capacity is not None else \
                ms.at_zero_since + CAPACITY_GRACE_S
            if refusal is None or refusal <= t:
                m.deadline_key, m.deadline_times = None, ()
            elif m.deadline_key != ("refusal", refusal):
                m.deadline_key, m.deadline_times = ("refusal", refusal), (refusal,)
                heapq.heappush(self.deadlines, (refusal, m.idx))
            return
        key = (ms.idle_since, ms.keep_alive)
        if m.deadline_key == key:
            return
        m.deadline_key = key
        due = wake_times(ms, t)
        m.deadline_times = due
        for when in due:
            heapq.heappush(self.deadlines, (when, m.idx))

    def _schedule_edge(self, m: SimModel, after: float) -> None:
        """Wake ``m`` when its next pre-warm window opens or closes after ``after`` (the
        clock is the cron's: t = 0 is 1970-01-01 00:00 UTC)."""
        m.schedule_next = next_edge(m.cfg.prewarm, after)
        if m.schedule_next is not None:
            heapq.heappush(self.deadlines, (m.schedule_next, m.idx))

    def _pool_deadlines(self) -> None:
        """Wake the pools when a cold start leaves the sizer's window or a hold ends."""
        for pool in self.cfg.pools:
            ps = self.state.pools.get(pool.shape)
            if ps is None:
                continue
            due = [t + COLD_START_WINDOW_S for t in ps.cold_starts[:1]]
            # Each prebuilt class's share of the standbys changes as its cold starts leave.
            due += [ts[0] + COLD_START_WINDOW_S for ts in ps.class_cold_starts.values() if ts]
            if ps.sizer.below_since is not None:
                due.append(ps.sizer.below_since + pool.standby_hold_s)
            for t in due:
                if t not in self.pool_deadlines:
                    self.pool_deadlines.add(t)
                    heapq.heappush(self.deadlines, (t, -1))
