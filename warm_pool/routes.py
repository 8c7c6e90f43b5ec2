"""The route table the controller publishes: ready replicas per model (an adapter's
under its own name), how many are loading, and why a model is failing; activators
long-poll it (``GET /v1/routes``), and it carries the key table's version.

The table's version moves only when something activators act on changes; it is 0
until the fleet is adopted after a start, and a watcher of another epoch (a restarted
controller's) gets the table at once. A watcher that holds one of the last
``HISTORY_VERSIONS`` versions gets a delta: only the models changed since (see
docs/REQUEST_PATH.md, "The route feed").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from thaw.config import Model, ThawConfig
from thaw.wire import ModelRoute, Phases, ReplicaRoute, RouteTable, WorkerState, WorkerStatus
from warm_pool.fleet.view import WorkerFacts
from warm_pool.history import ChangeHistory
from warm_pool.policy.decide import PolicyState, WorkerView


def route_table(cfg: ThawConfig, facts: Mapping[str, WorkerFacts], views: dict[str, WorkerView],
                state: PolicyState, now: float, *, revisions: Callable[[str], int | None] = lambda m: None,
                outdated: Mapping[str, frozenset[int]] | None = None,
                previous: Mapping[str, ModelRoute] | None = None,
                only: Collection[str] | None = None) -> dict[str, ModelRoute]:
    """Ready replicas per model, from the workers' views and last statuses, and each
    model's failures from the policy's state.

    During a roll (``outdated``: the revisions a roll replaces) a model's traffic goes to
    replicas of the current revision as soon as one is ready, and to the older ones until
    then. Each replica names the revision whose settings it serves: the current one (its
    engine is the same) or, for an outdated replica, its own.

    The workers are grouped by the model they serve (and by the adapters their engines
    hold) once, so a table costs O(models + workers), not their product. A model whose
    route equals its route in ``previous`` (the last table) gets that very object: most
    models' routes do not change from one tick to the next, and building 10,000 anew
    costs tens of milliseconds, and the feed's compare of each then costs one identity
    check.

    ``only``: the models whose routes may have changed since ``previous`` (``RouteTables``
    knows which); every other model keeps its route from ``previous``."""
    serving: dict[str, list[str]] = {}
    holding: dict[str, list[str]] = {}
    for wid, v in views.items():
        if v.model is not None:
            serving.setdefault(v.model, []).append(wid)
        for name in dict.fromkeys(a for a, _ in v.adapters):
            holding.setdefault(name, []).append(wid)
    models: dict[str, ModelRoute] = {}
    todo: Iterable[Model] = cfg.models
    if only is not None and previous is not None:
        # ``only`` names the models added and removed too: the others are as they were.
        todo = [m for name in only if (m := cfg.model(name)) is not None and m.name == name]
        models = dict(previous)
        for name in only:
            models.pop(name, None)
    for m in todo:
        if m.base is not None:
            ready, loading = _adapter_replicas(m, holding.get(m.name, []), facts, views)
        else:
            ready, loading = _model_replicas(m, serving.get(m.name, []), facts, views, revisions(m.name),
                                             (outdated or {}).get(m.name, frozenset()))
        ms = state.models.get(m.name)
        in_backoff = ms is not None and ms.backoff_until > now
        failed = ms is not None and ms.failures > 0
        # Its pool can give it no instance (an adapter waits on its base's engine): its
        # requests are refused at once, unless a failed load's backoff says more.
        waits_on = state.models.get(m.base) if m.base is not None else ms
        capacity = waits_on.at_capacity if waits_on is not None and not in_backoff else None
        fields = {"served_name": m.resolved_served_name, "replicas": sorted(ready, key=lambda r: r.worker_id),
                  "loading": loading, "failures": ms.failures if ms else 0,
                  "error": capacity or (ms.last_error if ms and failed else None),
                  "failure_kind": "capacity" if capacity else (ms.last_failure_kind if ms and failed else None),
                  "backoff_until": ms.backoff_until if ms and in_backoff else None}
        # Every field of the old route equal to the new one's: the same route (a field
        # added to ModelRoute and not set here makes them differ, never wrongly equal).
        # Its __dict__ holds exactly its fields (extra="forbid"); dict(prev) is a Python
        # generator and costs more than building the route anew.
        prev = previous.get(m.name) if previous is not None else None
        models[m.name] = prev if prev is not None and prev.__dict__ == fields else ModelRoute.model_validate(fields)
    return models


def _model_replicas(m: Model, wids: list[str], facts: Mapping[str, WorkerFacts], views: dict[str, WorkerView],
                    current: int | None, stale: frozenset[int]) -> tuple[list[ReplicaRoute], int]:
    """A model's ready replicas and how many are loading, from the workers that serve it."""
    ready, loading = [], 0
    for wid in wids:
        v, st = views[wid], facts[wid].status
        if v.state is WorkerState.READY and st is not None and st.engine_url:
            old = v.revision is not None and v.revision in stale
            ready.append(ReplicaRoute(worker_id=wid, url=st.engine_url,
                                      served_model_name=st.served_model_name or m.resolved_served_name,
                                      assignment_id=v.assignment_id, phases=st.phases, load=st.load,
                                      worker_started_at=st.started_at, packed=v.host is not None,
                                      revision=v.revision if old else (current or v.revision),
                                      batch=v.batch))
        elif v.state is WorkerState.LOADING:
            loading += 1
    if stale and any(r.revision not in stale for r in ready):
        ready = [r for r in ready if r.revision not in stale]
    return ready, loading


def _adapter_replicas(m: Model, wids: list[str], facts: Mapping[str, WorkerFacts],
                      views: dict[str, WorkerView]) -> tuple[list[ReplicaRoute], int]:
    """An adapter's replicas: the engines of its base that hold it, under its own name,
    and how many are loading it, from the workers whose engines list it."""
    ready, loading = [], 0
    for wid in wids:
        v, st = views[wid], facts[wid].status
        if v.model != m.base:
            continue
        held = v.adapter(m.name)
        a = next((x for x in st.adapters if x.model == m.name), None) if st is not None else None
        if held == "ready" and a is not None and v.state is WorkerState.READY and st is not None and st.engine_url:
            # Its phases are its load's; each load is a replica of its own.
            ready.append(ReplicaRoute(
                worker_id=wid, url=st.engine_url, served_model_name=m.resolved_served_name,
                assignment_id=f"{v.assignment_id}/{m.name}@{a.requested_at}",
                phases=Phases(assigned=a.requested_at, weights_loaded=a.since, engine_ready=a.since),
                load=st.load, worker_started_at=st.started_at, packed=v.host is not None, adapter=True,
                base_ready_at=st.phases.engine_ready))
        elif held == "loading":
            loading += 1
    return ready, loading


class RouteTables:
    """The route table kept up to date tick by tick: only the models whose inputs changed
    since the last table are routed again (:func:`route_table`'s ``only``), the others
    keep their routes. With 10,000 models on 1,000 workers, routing every model each
    turn was most of an idle turn.

    A model's route reads its config entry, its workers' views and last statuses (an
    adapter's: its base's workers holding it), its policy state (failures, backoff,
    capacity; an adapter's capacity is its base's), its current revision and the
    revisions its roll replaces, and the time (whether a backoff has ended): each is
    compared with the last table's inputs by identity, which is cheap, and a model in
    backoff is routed again each tick until its backoff ends."""

    def __init__(self) -> None:
        self.table: dict[str, ModelRoute] | None = None
        self._models: list[Model] | None = None
        self._by_name: dict[str, Model] = {}
        self._workers: dict[str, tuple[WorkerView, WorkerStatus | None]] = {}
        self._states: Mapping[str, object] = {}
        self._registry: object = None
        self._revisions: dict[str, tuple[int | None, frozenset[int]]] = {}
        self._backoff: set[str] = set()
        # Models routed by the last table (a test reads it).
        self.routed = 0

    def build(self, cfg: ThawConfig, facts: Mapping[str, WorkerFacts], views: dict[str, WorkerView],
              state: PolicyState, now: float, *, revisions: Callable[[str], int | None],
              outdated: Mapping[str, frozenset[int]], registry_version: object) -> dict[str, ModelRoute]:
        only = None if self.table is None else \
            self._changed(cfg, facts, views, state, revisions, outdated, registry_version)
        if only is None:
            self._models, self._by_name = cfg.models, {m.name: m for m in cfg.models}
            self._workers = {wid: (v, facts[wid].status) for wid, v in views.items()}
            self._states = state.models
            self._registry = registry_version
            self._revisions = {m.name: (revisions(m.name), outdated.get(m.name, frozenset())) for m in cfg.models}
        table = route_table(cfg, facts, views, state, now, revisions=revisions, outdated=outdated,
                            previous=self.table, only=only)
        self.routed = len(cfg.models) if only is None else len(only & self._by_name.keys())
        self._backoff = {n for n in (table if only is None else only | self._backoff)
                         if (r := table.get(n)) is not None and r.backoff_until is not None}
        self.table = table
        return table

    def _changed(self, cfg: ThawConfig, facts: Mapping[str, WorkerFacts], views: dict[str, WorkerView],
                 state: PolicyState, revisions: Callable[[str], int | None],
                 outdated: Mapping[str, frozenset[int]], registry_version: object) -> set[str]:
        """The models whose route inputs changed since the last table (taken in as the last)."""
        changed = set(self._backoff)
        if cfg.models is not self._models:
            by_name = {m.name: m for m in cfg.models}
            changed |= {n for n in by_name.keys() | self._by_name.keys() if by_name.get(n) is not self._by_name.get(n)}
            self._models, self._by_name = cfg.models, by_name
        workers = {wid: (v, facts[wid].status) for wid, v in views.items()}
        for wid in workers.keys() | self._workers.keys():
            old, new = self._workers.get(wid), workers.get(wid)
            if old is not None and new is not None and old[0] == new[0] and old[1] is new[1]:
                continue
            for seen in (old, new):
                if seen is not None:
                    v = seen[0]
                    if v.model is not None:
                        changed.add(v.model)
                    changed.update(name for name, _ in v.adapters)
        self._workers = workers
        if state.models is not self._states:
            changed |= {n for n, ms in state.models.items() if self._states.get(n) is not ms}
            changed |= {n for n in self._states if n not in state.models}
            self._states = state.models
        if registry_version != self._registry:
            self._registry = registry_version
            for m in cfg.models:
                now_rev = (revisions(m.name), outdated.get(m.name, frozenset()))
                if self._revisions.get(m.name) != now_rev:
                    self._revisions[m.name] = now_rev
                    changed.add(m.name)
        # An adapter's route reads its base's state and workers: routed with its base.
        for name in list(changed):
            changed.update(a.name for a in cfg.adapters_of(name))
        return changed


# How many versions back a long poll is answered with a delta (older: the whole table).
HISTORY_VERSIONS = 256


def route_changes(old: Mapping[str, ModelRoute], new: Mapping[str, ModelRoute]) -> tuple[set[str], bool]:
    """The models whose route differs in any field between two tables (added and
    removed ones included), and whether any differs in what activators act on: its
    replicas' urls and revisions, loading, failures, error, being in backoff. Only
    those move the table's version; the rest (a replica's phases, load, the backoff's
    end) ride along with the next move."""
    changed = {name for name in old if name not in new}
    moves = bool(changed)
    for name, route in new.items():
        prev = old.get(name)
        if prev is route or prev == route:
            continue
        changed.add(name)
        moves = moves or prev is None or _acted_on(prev) != _acted_on(route)
    return changed, moves


def _acted_on(r: ModelRoute) -> tuple[Any, ...]:
    return (tuple((x.url, x.revision) for x in r.replicas), r.loading, r.failures, r.error,
            r.backoff_until is not None)


class RouteFeed:
    """The published route table (``table``), versioned, and its long poll, answered
    with a delta when the watcher holds a version the feed still has the changes of."""

    def __init__(self, epoch: str, *, history: int = HISTORY_VERSIONS) -> None:
        self.epoch = epoch
        self.table = RouteTable(epoch=epoch, version=0, models={})
        self._changed = asyncio.Condition()
        self._closed = False
        # The models changed by each of the last versions since the first table (version
        # 1, which has no table before it to change); and those changed since the current
        # version was published without moving it (they count as the next version's).
        self._history = ChangeHistory(1, history)
        self._pending: set[str] = set()

    async def publish(self, models: dict[str, ModelRoute], *, activators: int, keys_version: int,
                      catalog_version: int = 0) -> None:
        """Publish a new table; its version moves (and watchers wake) only when what
        activators act on changed, or on the first publication."""
        table = RouteTable(epoch=self.epoch, version=self.table.version, models=models, activators=activators,
                           keys_version=keys_version, catalog_version=catalog_version)
        # Compared and set under the lock: two publications that overlapped would each
        # compare with the table before both, and a change could miss the history.
        async with self._changed:
            changed, moves = route_changes(self.table.models, models)
            moves = moves or (activators, keys_version, catalog_version) != (
                self.table.activators, self.table.keys_version, self.table.catalog_version)
            self._pending |= changed
            if moves or self.table.version == 0:
                version = self.table.version + 1
                if self.table.version > 0:  # the first table has no table before it to change
                    self._history.record(version, frozenset(self._pending))
                self._pending = set()
                self.table = table.model_copy(update={"version": version})
                self._changed.notify_all()
            else:
                self.table = table

    def answer(self, since: int, epoch: str | None, *, delta: bool = False) -> RouteTable:
        """The table for a watcher that holds version ``since`` of ``epoch``: with
        ``delta``, and that version recent enough, only what changed since (whatever
        changed after it was published, so the watcher's copy of it, taken at any time,
        merges into this table exactly); else the whole table."""
        t = self.table
        if not delta or epoch != self.epoch or not self._history.covers(since, t.version):
            return t
        names = self._pending | self._history.since(since)
        return t.model_copy(update={"base_version": since,
                                    "models": {n: t.models[n] for n in names if n in t.models},
                                    "removed": sorted(n for n in names if n not in t.models)})

    async def wait(self, since: int, epoch: str | None, timeout_s: float, *,
                   delta: bool = False) -> RouteTable | None:
        """The route table once its version is past ``since`` (at once for a watcher of
        another epoch, or once the feed is closed), or after ``timeout_s``; None before
        the first publication. ``delta``: see ``answer``."""
        def ready() -> bool:
            return self._closed or (self.table.version > 0 and (epoch != self.epoch or self.table.version > since))

        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
        return self.answer(since, epoch, delta=delta) if self.table.version > 0 else None

    async def close(self) -> None:
        """Answer every long poll now (a shutdown must not wait for them)."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
