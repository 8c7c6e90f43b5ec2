"""Which models the controller's tick judges: those whose decision can change.

With thousands of models, most at zero and idle, judging every model on every tick is
most of the tick's cost (about 150 µs a model) and almost always gives nothing. A tick
judges a model when one of its inputs changed since the last tick (its traffic, its
workers' views, its config entry, its roll, its batch lines, its engine class or size),
when its last judgement left it unsettled (``warm_pool.policy.settle.settled``: a step
pending, a backoff, a pre-warm window, a wait for a replica), or when a time that
changes it without any input comes (its keep-alive window opening or closing, a
pre-warm window's edge). The other models keep their state untouched, exactly as
``decide(only=...)`` promises; a change of the config beyond its models (pools,
shapes, budgets) judges them all.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping

from thaw.config import Model, ThawConfig
from warm_pool.policy.decide import ModelActivity, PolicyState, Snapshot, WorkerView
from warm_pool.policy.decisions import Decision
from warm_pool.policy.prewarm import next_edge
from warm_pool.policy.settle import settled, wake_times
from warm_pool.policy.states import SERVING


def _rest(cfg: ThawConfig) -> ThawConfig:
    """``cfg`` less its models and tenants (what, changed, judges every model)."""
    return cfg.model_copy(update={"models": [], "tenants": []})


def _changed_keys(old: Mapping[str, object], new: Mapping[str, object]) -> set[str]:
    if old is new or old == new:
        return set()
    return {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}


class Judging:
    """The models each tick judges (:meth:`select`), and what it must remember of the
    tick for the next (:meth:`judged`). A new term of leading starts a new one."""

    def __init__(self) -> None:
        self._cfg: ThawConfig | None = None
        self._rest: ThawConfig | None = None
        self._by_name: dict[str, Model] = {}
        self._groups: dict[str, tuple[str, ...]] = {}  # a base and its adapters, for each of them
        self._views: dict[str, WorkerView] = {}
        self._activity: Mapping[str, ModelActivity] = {}
        self._inputs: tuple[Mapping[str, object], ...] = ()
        self._watch: set[str] = set()
        self._band_for: dict[str, int | None] = {}
        self._wakes: list[tuple[float, str]] = []
        self._wake_at: dict[str, tuple[float, ...]] = {}
        # Models judged over the last tick (thaw_pool_models_judged).
        self.last_judged = 0

    # -- before the tick ---------------------------------------------------------------
    def select(self, snap: Snapshot, cfg: ThawConfig, now: float) -> set[str] | None:
        """The models to judge at ``now`` (None: every one). Takes in the snapshot's
        inputs as the last seen."""
        changed = self._config(cfg)
        workers = self._workers(snap.workers)
        # New arrivals or TTFT samples are inputs even where the counts repeat a tick's.
        activity = _changed_keys(self._activity, snap.activity) | {
            n for n, a in snap.activity.items() if a.arrivals or a.ttfts}
        self._activity = snap.activity
        inputs: tuple[Mapping[str, object], ...] = (snap.outdated, snap.batch_demand, snap.model_classes,
                                                    snap.engine_bytes)
        old_inputs, self._inputs = self._inputs, inputs
        if changed is None:
            return None
        changed |= workers | activity | self._watch
        # A model with batch lines waits for a standby any worker's change may free: it
        # is judged while its lines wait (batch models are few).
        changed |= {n for n, lines in snap.batch_demand.items() if lines}
        for old, new in zip(old_inputs, inputs, strict=False):
            changed |= _changed_keys(old, new)
        while self._wakes and self._wakes[0][0] <= now:
            at, name = heapq.heappop(self._wakes)
            if at in self._wake_at.get(name, ()):
                changed.add(name)
        return self._grouped(changed)

    def _config(self, cfg: ThawConfig) -> set[str] | None:
        """The models whose config entry changed (None: the first config, or one whose
        pools, shapes or budgets changed: every model is judged)."""
        if cfg is self._cfg:
            return set()
        rest = _rest(cfg)
        by_name = {m.name: m for m in cfg.models}
        everything = self._cfg is None or rest != self._rest
        changed = None if everything else {
            n for n in by_name.keys() | self._by_name.keys()
            if (old := self._by_name.get(n)) is not (new := by_name.get(n)) and old != new}
        self._cfg, self._rest, self._by_name = cfg, rest, by_name
        groups: dict[str, list[str]] = {}
        for m in cfg.models:
            groups.setdefault(m.base or m.name, []).append(m.name)
        self._groups = {n: tuple(g) for g in groups.values() for n in g}
        return changed

    def _workers(self, workers: Iterable[WorkerView]) -> set[str]:
        """The models (and adapters) whose workers' views changed since the last tick
        (the models waiting at zero are judged every tick anyway: never settled)."""
        views = {w.id: w for w in workers}
        changed: set[str] = set()
        for wid in views.keys() | self._views.keys():
            old, new = self._views.get(wid), views.get(wid)
            if old == new:
                continue
            for v in (old, new):
                if v is not None and v.model is not None:
                    changed.add(v.model)
                    changed.update(name for name, _ in v.adapters)
        self._views = views
        return changed

    def _grouped(self, names: Collection[str]) -> set[str]:
        """``names`` with their groups (a base and its adapters judged as one), less
        models not in the config."""
        out: set[str] = set()
        for n in names:
            out.update(self._groups.get(n, ()))
        return out

    # -- after the tick ---------------------------------------------------------------
    def judged(self, names: Collection[str] | None, snap: Snapshot, state: PolicyState,
               decisions: Collection[Decision], now: float) -> None:
        """Remember which of the judged models are settled (the others are judged again
        next tick) and when the settled ones must be looked at again."""
        judged = self._by_name.keys() if names is None else names
        self.last_judged = len(judged)
        acted = {model for d in decisions if isinstance(model := getattr(d, "model", None), str)}
        demand = self._demand(snap.activity)
        for name in judged:
            m = self._by_name.get(name)
            ms = state.models.get(name)
            if m is None or ms is None:
                self._watch.discard(name)
                continue
            ok, self._band_for[name] = settled(
                ms, m, serving=self._serving(snap, m), demand=demand.get(name, 0), now=now,
                shape_changed=True, band_for=self._band_for.get(name))
            if ok and name not in acted and not snap.outdated.get(name):
                self._watch.discard(name)
                self._wake_later(name, (*wake_times(ms, now), *self._edge(m, now)))
            else:
                self._watch.add(name)

    def _demand(self, activity: Mapping[str, ModelActivity]) -> dict[str, int]:
        """Each model's demand as ``decide`` counts it: a base's with its adapters'."""
        out: dict[str, int] = {}
        for name, act in activity.items():
            if act.demand:
                out[name] = out.get(name, 0) + act.demand
                m = self._by_name.get(name)
                if m is not None and m.base is not None:
                    out[m.base] = out.get(m.base, 0) + act.demand
        return out

    @staticmethod
    def _serving(snap: Snapshot, m: Model) -> int:
        if m.base is None:
            return sum(1 for w in snap.by_model.get(m.name, ()) if w.state in SERVING)
        return sum(1 for w in snap.by_model.get(m.base, ()) if w.state == "ready"
                   and w.adapter(m.name) in ("loading", "ready"))

    @staticmethod
    def _edge(m: Model, now: float) -> tuple[float, ...]:
        edge = next_edge(m.prewarm, now) if m.prewarm else None
        return () if edge is None else (edge,)

    def _wake_later(self, name: str, times: tuple[float, ...]) -> None:
        if self._wake_at.get(name) == times:
            return
        self._wake_at[name] = times
        for at in times:
            heapq.heappush(self._wakes, (at, name))

