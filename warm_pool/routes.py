"""The route table the controller publishes: ready replicas per model (an adapter's
under its own name), how many are loading, and why a model is failing; activators
long-poll it (``GET /v1/routes``), and it carries the key table's version.

The table's version moves only when something activators act on changes; it is 0
until the fleet is adopted after a start, and a watcher of another epoch (a restarted
controller's) gets the table at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from thaw.config import ThawConfig
from thaw.wire import ModelRoute, Phases, ReplicaRoute, RouteTable, WorkerState
from warm_pool.fleet.view import WorkerFacts
from warm_pool.policy.decide import PolicyState, WorkerView


def route_table(cfg: ThawConfig, facts: Mapping[str, WorkerFacts], views: dict[str, WorkerView],
                state: PolicyState, now: float, *, revisions: Callable[[str], int | None] = lambda m: None,
                outdated: Mapping[str, frozenset[int]] | None = None) -> dict[str, ModelRoute]:
    """Ready replicas per model, from the workers' views and last statuses, and each
    model's failures from the policy's state.

    During a roll (``outdated``: the revisions a roll replaces) a model's traffic goes to
    replicas of the current revision as soon as one is ready, and to the older ones until
    then. Each replica names the revision whose settings it serves: the current one (its
    engine is the same) or, for an outdated replica, its own."""
    models: dict[str, ModelRoute] = {}
    for m in cfg.models:
        ready, loading = [], 0
        stale = (outdated or {}).get(m.name, frozenset())
        current = revisions(m.name)
        for wid, v in views.items():
            st = facts[wid].status
            if m.base is not None:
                # An adapter: the engines of its base that hold it, under its own name.
                held = v.adapter(m.name) if v.model == m.base else None
                a = next((x for x in st.adapters if x.model == m.name), None) if st is not None else None
                if held == "ready" and a is not None and v.state is WorkerState.READY and st is not None \
                        and st.engine_url:
                    # Its phases are its load's; each load is a replica of its own.
                    ready.append(ReplicaRoute(
                        worker_id=wid, url=st.engine_url, served_model_name=m.resolved_served_name,
                        assignment_id=f"{v.assignment_id}/{m.name}@{a.requested_at}",
                        phases=Phases(assigned=a.requested_at, weights_loaded=a.since, engine_ready=a.since),
                        load=st.load, worker_started_at=st.started_at, packed=v.host is not None, adapter=True,
                        base_ready_at=st.phases.engine_ready))
                elif held == "loading":
                    loading += 1
                continue
            if v.model != m.name:
                continue
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
        ms = state.models.get(m.name)
        in_backoff = ms is not None and ms.backoff_until > now
        failed = ms is not None and ms.failures > 0
        # Its pool can give it no instance (an adapter waits on its base's engine): its
        # requests are refused at once, unless a failed load's backoff says more.
        waits_on = state.models.get(m.base) if m.base is not None else ms
        capacity = waits_on.at_capacity if waits_on is not None and not in_backoff else None
        models[m.name] = ModelRoute(
            served_name=m.resolved_served_name, replicas=sorted(ready, key=lambda r: r.worker_id),
            loading=loading, failures=ms.failures if ms else 0,
            error=capacity or (ms.last_error if ms and failed else None),
            failure_kind="capacity" if capacity else (ms.last_failure_kind if ms and failed else None),
            backoff_until=ms.backoff_until if ms and in_backoff else None,
        )
    return models


class RouteFeed:
    """The published route table (``table``), versioned, and its long poll."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.table = RouteTable(epoch=epoch, version=0, models={})
        self._changed = asyncio.Condition()
        self._closed = False

    async def publish(self, models: dict[str, ModelRoute], *, activators: int, keys_version: int,
                      catalog_version: int = 0) -> None:
        """Publish a new table; its version moves (and watchers wake) only when what
        activators act on changed, or on the first publication."""
        table = RouteTable(epoch=self.epoch, version=self.table.version, models=models, activators=activators,
                           keys_version=keys_version, catalog_version=catalog_version)

        # Only the parts activators act on decide whether the version moves.
        def key(t: RouteTable) -> Any:
            return ({n: (tuple((r.url, r.revision) for r in v.replicas), v.loading, v.failures, v.error,
                         v.backoff_until is not None) for n, v in t.models.items()}, t.activators, t.keys_version,
                    t.catalog_version)

        if key(table) != key(self.table) or self.table.version == 0:
            async with self._changed:
                self.table = table.model_copy(update={"version": self.table.version + 1})
                self._changed.notify_all()
        else:
            self.table = table

    async def wait(self, since: int, epoch: str | None, timeout_s: float) -> RouteTable | None:
        """The route table once its version is past ``since`` (at once for a watcher of
        another epoch, or once the feed is closed), or after ``timeout_s``; None before
        the first publication."""
        def ready() -> bool:
            return self._closed or (self.table.version > 0 and (epoch != self.epoch or self.table.version > since))

        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
        return self.table if self.table.version > 0 else None

    async def close(self) -> None:
        """Answer every long poll now (a shutdown must not wait for them)."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
