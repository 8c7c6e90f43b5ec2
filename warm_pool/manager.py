"""The pool manager: the stateful shell around ``warm_pool.policy.decide.decide``.

Each turn of its loop it takes in what the providers say of their instances
(``warm_pool.providers.instances``), derives each worker's view from the facts it holds
(``warm_pool.facts``: the providers', heartbeats, intents), sums the activators'
traffic (``warm_pool.traffic``), calls the policy, carries out its decisions through the
providers and the workers' control API (``warm_pool.actuator``), publishes the route
table that activators long-poll (``warm_pool.routes``) and exports its metrics
(``warm_pool.metrics``). What operators change at run time is ``warm_pool.registry.admin``'s;
their view of the pool is ``warm_pool.status``'s.

A restart does no harm: on start it lists the providers' instances, waits at least one
heartbeat interval (``adopt_grace_s``) and until every running instance's worker has
reported (at most ``worker_timeout_s`` more: one that has not by then is unreachable),
adopts what is loading and serving, and only then decides or publishes routes. A
worker not heard from yet looks like one still booting, and deciding on that picture
would take a serving worker for a spare standby and terminate a real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from thaw.aio import wait_event
from thaw.batch_lines import tenant_models
from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.wire import (
    BudgetChange,
    BudgetView,
    Catalog,
    ColdStartRecord,
    HeartbeatReply,
    KeyTable,
    ModelRoute,
    NewKeyReply,
    PoolEvent,
    PoolStatus,
    RevokeReply,
    RouteTable,
    WorkerState,
    WorkerStatus,
)
from warm_pool.actuator import Actuator
from warm_pool.batch.files import FileIndex
from warm_pool.batch.runner import BatchRunner
from warm_pool.batch.store import BatchStore
from warm_pool.classes import ModelClasses, engine_bytes
from warm_pool.clock import ClockAdmin
from warm_pool.control import WorkerControl
from warm_pool.conversations.store import ResponseStore
from warm_pool.db import Db, StateUnavailable
from warm_pool.events import EventLog
from warm_pool.facts import FleetFacts
from warm_pool.leader import Leadership, LeaseStore
from warm_pool.metrics import PoolMetrics, export
from warm_pool.persist import ControllerStore
from warm_pool.policy.batch import standby_use
from warm_pool.policy.decide import (
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
)
from warm_pool.providers.instances import InstanceWatch
from warm_pool.providers.provider import Provider
from warm_pool.registry.admin import BudgetAdmin, KeyAdmin
from warm_pool.registry.apply import Applier
from warm_pool.registry.keys import KeyStore
from warm_pool.registry.models import ModelRegistry, StoreReader
from warm_pool.registry.store import REGISTRY_FILE, RegistryStore
from warm_pool.registry.tenants import TenantAdmin
from warm_pool.routes import RouteFeed, route_table
from warm_pool.status import pool_status
from warm_pool.traffic import Traffic
from warm_pool.view import WorkerFacts, count_states

log = get_logger()

# How often stored responses past their retention are deleted.
RESPONSES_PURGE_INTERVAL_S = 3600.0


class PoolManager:
    def __init__(
        self,
        cfg: ThawConfig,
        providers: dict[str, Provider],
        control: WorkerControl,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        poll_interval_s: float = 0.25,
        adopt_grace_s: float | None = None,
        refresh_interval_s: float | None = None,
        epoch: str | None = None,
        state_dir: Path | None = None,
        model_classes: ModelClasses | None = None,
        store_reader: StoreReader | None = None,
        store_client: Callable[[], Any] | None = None,
        state_db: Db | None = None,
        lease: LeaseStore | None = None,
        controller_id: str | None = None,
        url: str = "",
        lease_s: float | None = None,
    ) -> None:
        """``providers`` maps each pool's shape to the provider that runs it.
        ``state_dir``: where what must outlive a restart is kept (None: nowhere).
        ``model_classes``: each model's engine class (placement into pre-built
        engines); None: no model has a known class. ``store_reader``: how the model
        registry checks a deploy's weights in the store (None: deploys are refused).
        ``store_client``: a boto3 S3 client of the object store, for batches' files
        (None: batches fail their validation).
        ``state_db``: where the registry is kept (None: ``state_dir/registry.db``).
        ``lease``: the leader's lease, when several controllers share ``state_db``
        (``warm_pool.leader``; None: this one always leads); ``url``: where the others
        and clients reach this one; ``lease_s``: None, 1.5 heartbeat intervals."""
        self.providers = providers
        self.control = control
        self.model_classes = model_classes
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        # One heartbeat interval and a margin: long enough for every live worker to report.
        self.adopt_grace_s = (cfg.cluster.heartbeat_interval_s * 1.5 + 0.5) if adopt_grace_s is None else adopt_grace_s
        self.epoch = epoch or uuid.uuid4().hex[:8]
        self.controller_id = controller_id or uuid.uuid4().hex[:12]
        self.url = url
        self.registry = registry or CollectorRegistry()
        self.metrics = PoolMetrics(self.registry)
        self._wake = asyncio.Event()
        # The config in force (self.cfg): the config as written serving the registry's
        # models, with the operators' budget changes (both in the state database, so a
        # restart or another controller keeps them).
        db = state_db or Db.sqlite(state_dir / REGISTRY_FILE if state_dir else None)
        self.store = ControllerStore(db, state_dir)
        self.files = FileIndex(db)
        self.batches = BatchStore(db)
        self.responses = ResponseStore(db)
        self._responses_purged_at = float("-inf")
        self.batch_runner = BatchRunner(
            self.batches, self.files, store_client, cfg.object_store.bucket, cfg.batch.files_prefix,
            resolver=lambda tenant: tenant_models(self.model_admin.cfg, tenant), clock=clock,
            leading=lambda: self.leading, metrics=self.metrics)
        self.batch_runner.on_demand = self._wake.set
        # Per shape, standby instance-seconds (idle, lent to batch) since this controller
        # started, and when they were last counted.
        self.standby_seconds: dict[str, tuple[float, float]] = {}
        self._standby_counted_at: float | None = None
        self.event_log = EventLog(clock, controller=self.controller_id)
        self.clock_admin = ClockAdmin(clock, self.event_log, lambda: self.cfg, self._wake.set)
        self.model_admin = ModelRegistry(cfg, RegistryStore(db),
                                         store_reader, self.event_log, on_change=self._models_changed,
                                         clock=clock)
        self.budgets = BudgetAdmin(self.model_admin.cfg, self.store, self.event_log, self._wake.set)
        self.key_admin = KeyAdmin(cfg, state_dir, self.event_log, self._keys_changed,
                                  tenants=lambda: self.model_admin.base.tenants, db=state_db)
        self.tenant_admin = TenantAdmin(self.model_admin, self.event_log, clock=clock,
                                        on_removed=self._tenant_removed)
        self.applier = Applier(self.model_admin, self.tenant_admin, self.event_log, clock=clock)
        self._refresh_interval_s = refresh_interval_s
        self._fresh_term(self.epoch)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # Turns of the loop taken (a test waits on it to see that nothing happened).
        self.steps = 0
        self._loop = True
        # Several controllers on one database: this one leads while it holds the lease.
        self.leadership = None if lease is None else Leadership(
            lease, self.controller_id, url, lease_s or cfg.cluster.heartbeat_interval_s * 1.5,
            on_lead=self._lead, on_follow=self._follow)

    def _fresh_term(self, epoch: str) -> None:
        """What a controller learns of the fleet anew each time it starts leading: the
        facts, the traffic, the policy's state, the calls in flight and the route feed."""
        self.epoch = epoch
        self.state = PolicyState(epoch=epoch, models={
            name: ModelState(idle_histogram=h) for name, h in self.store.load_histograms(self.cfg).items()})
        self._saved_histograms = {n: ms.idle_histogram for n, ms in self.state.models.items()}
        budgets, clock = self.budgets, self.clock
        self.fleet = FleetFacts(config=lambda: budgets.cfg, clock=clock, epoch=epoch, metrics=self.metrics,
                                wake=self._wake.set)
        self.instances = InstanceWatch(self.providers, self.fleet, clock=clock,
                                       refresh_interval_s=self._refresh_interval_s)
        self.traffic = Traffic(clock=clock, wake=self._wake.set)
        self.actuator = Actuator(fleet=self.fleet, providers=self.providers, control=self.control,
                                 config=lambda: budgets.cfg, model_classes=self.model_classes, clock=clock,
                                 events=self.event_log, metrics=self.metrics, wake=self._wake.set,
                                 refresh_soon=self.instances.refresh_soon, revision_of=self.model_admin.revision)
        self.feed = RouteFeed(epoch)
        self.adopt_until: float | None = None
        self.adopted = False
        self.metrics.adopted.set(0)
        self._shortfalls: dict[str, int] = {}

    # -- the parts' state, as the API and tests read it -------------------------------
    @property
    def cfg(self) -> ThawConfig:
        """The config in force: the config as written with run-time budget changes."""
        return self.budgets.cfg

    @property
    def facts(self) -> dict[str, WorkerFacts]:
        return self.fleet.facts

    @property
    def events(self) -> deque[PoolEvent]:
        return self.event_log.events

    @property
    def routes(self) -> RouteTable:
        """The route table last published."""
        return self.feed.table

    @property
    def keys(self) -> KeyStore:
        return self.key_admin.keys

    @property
    def cold_starts(self) -> dict[str, ColdStartRecord]:
        return self.traffic.cold_starts

    # -- lifecycle ------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """This controller decides (the only one, or the one holding the lease)."""
        return self.leadership is None or self.leadership.leading

    @property
    def leader_url(self) -> str | None:
        """Where the leader is (None: this one leads alone, or nobody leads now)."""
        return self.leadership.leader_url if self.leadership is not None else None

    @property
    def term(self) -> int | None:
        return self.leadership.term if self.leadership is not None else None

    async def start(self, *, loop: bool = True) -> None:
        """Lead at once (the only controller), or once this one holds the lease.
        ``loop=False``: the caller calls :meth:`step`."""
        self._loop = loop
        await self.batch_runner.start()
        if self.leadership is None:
            await self._begin()
        else:
            await self.leadership.start()

    async def _begin(self) -> None:
        """List what the providers run, then start the loop (which decides nothing until
        the adoption grace has passed)."""
        now = self.clock()
        for inst in await self.instances.list_instances():
            self.fleet.observe(inst.worker_id, inst.shape, instance=inst, adopted_at=now)
        self.adopt_until = now + self.adopt_grace_s
        log.info("controller_started", epoch=self.epoch, instances=len(self.facts),
                 adopt_grace_s=self.adopt_grace_s, term=self.term)
        if self._loop:
            self._task = asyncio.create_task(self._run(), name="pool-manager")

    async def _lead(self, term: int) -> None:
        """This controller took the lease: take in what the one before it changed
        (models, tenants, keys, budgets), then adopt the fleet as a restarted one does."""
        self.event_log.term = term
        await self.model_admin.refresh()
        await self.key_admin.refresh()
        await self.budgets.reload()
        if self.adopt_until is not None:  # it led before: start over with a new epoch
            self._fresh_term(uuid.uuid4().hex[:8])
        self.event_log.record("leader", "elected", outcome="leading",
                              inputs={"controller": self.controller_id, "term": term, "epoch": self.epoch})
        await self._begin()

    async def _follow(self) -> None:
        """This controller lost the lease: it acts no more (calls in flight are
        cancelled) and long polls answer now, so their callers find the leader."""
        await self._stop_loop()
        await self.actuator.cancel()
        await self.feed.close()
        self.adopted = False
        self.metrics.adopted.set(0)

    async def _stop_loop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def stop_deciding(self) -> None:
        """The first step of a shutdown: no more decisions (heartbeats stop arriving as the
        server closes, and silence must not read as dead workers), and long polls answer
        now instead of holding the shutdown up."""
        self._closing = True
        await self.batch_runner.close()
        await self._stop_loop()
        await self.feed.close()

    async def close(self) -> None:
        """Stop deciding and hand the lease on. Instances and workers are left as they
        are: the next controller adopts them."""
        await self.stop_deciding()
        await self.actuator.cancel()
        await self._flush_events()
        if self.leadership is not None:
            await self.leadership.close()
        await self.instances.close()
        await self.control.close()
        self.keys.close()
        self.model_admin.store.close()

    # -- what outlives a restart -----------------------------------------------------
    async def _save_keepalive(self) -> None:
        current = {n: ms.idle_histogram for n, ms in self.state.models.items()}
        if current == self._saved_histograms:
            return
        try:
            await asyncio.to_thread(self.store.save_histograms, self.cfg, current)
            self._saved_histograms = current
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            log.warning("keepalive_state_not_saved", error=str(exc))

    # -- operators: budgets and API keys (warm_pool.registry.admin) -----------------------------
    def budget_view(self) -> BudgetView:
        return self.budgets.view()

    async def change_budget(self, change: BudgetChange, who: str) -> BudgetView:
        """Apply an operator's budget change (:meth:`BudgetAdmin.change`)."""
        return await self.budgets.change(change, who)

    async def add_key(self, tenant: str, label: str | None, who: str) -> NewKeyReply:
        """A new key for a tenant of the config (:meth:`KeyAdmin.add`)."""
        return await self.key_admin.add(tenant, label, who)

    async def revoke_key(self, key: str, who: str) -> RevokeReply:
        """Revoke a key (:meth:`KeyAdmin.revoke`)."""
        return await self.key_admin.revoke(key, who)

    async def key_table(self) -> KeyTable:
        return await self.key_admin.table()

    async def _keys_changed(self) -> None:
        if self.routes.version > 0:  # before adoption, the first table carries it
            await self._publish_routes()

    async def _models_changed(self, cfg: ThawConfig) -> None:
        """The registry changed: the new config in force from the next tick, and a route
        table that tells activators to fetch the catalog."""
        self.budgets.rebase(cfg)
        self._wake.set()
        if self.routes.version > 0:
            await self._publish_routes()

    def catalog(self) -> Catalog:
        """The models and tenants activators serve (``GET /v1/catalog``)."""
        cfg = self.cfg
        return Catalog(version=self.model_admin.version, models=cfg.models, tenants=cfg.tenants)

    # -- inputs: workers (warm_pool.facts) and activators (warm_pool.traffic) -----------
    def heartbeat(self, status: WorkerStatus) -> HeartbeatReply:
        """A worker's heartbeat (:meth:`FleetFacts.heartbeat`: raises ``UnknownInstance``)."""
        reply = self.fleet.heartbeat(status)
        return reply if self.term is None else reply.model_copy(update={"term": self.term})

    def report(self, activator_id: str, models: dict[str, ModelActivity], arrivals: dict[str, int] | None = None,
               ttfts: dict[str, list[float]] | None = None) -> None:
        """An activator's traffic (:meth:`Traffic.report`)."""
        self.traffic.report(activator_id, models, arrivals, ttfts)

    def demand(self, model: str) -> None:
        """A request is waiting for ``model`` at zero (:meth:`Traffic.demand`)."""
        self.traffic.demand(model)

    def record_cold_start(self, record: ColdStartRecord) -> None:
        self.traffic.record_cold_start(record)

    def activity(self, now: float) -> dict[str, ModelActivity]:
        return self.traffic.activity(now)

    def views(self, now: float) -> dict[str, WorkerView]:
        return self.fleet.views(now)

    # -- the loop -------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool_tick_failed")
            self.steps += 1
            await wait_event(self._wake, self.poll_interval_s)
            self._wake.clear()

    async def step(self) -> None:
        """One turn of the loop: refresh what the providers say, adopt the fleet once the
        grace has passed, then decide, act and publish routes (a test drives this with
        its own clock)."""
        await self.instances.refresh()
        now = self.clock()
        if self.model_classes is not None and self.model_classes.due(self.cfg, now):
            await self.model_classes.refresh(self.cfg)
        if not self.adopted and self.adopt_until is not None and now >= self.adopt_until and (
                not self.fleet.unreported() or now >= self.adopt_until + self.cfg.cluster.worker_timeout_s):
            self._adopt(now)
        if not self.leading:
            return  # its lease ran out by its own count: not one more decision
        if self.adopted:
            self._tick()
            await self._publish_routes()
            await self._save_keepalive()
            await self._purge_responses(now)
        await self._flush_events()

    async def event_history(self, since: float) -> list[PoolEvent]:
        """The decision log since ``since``: every controller's events, each naming its
        controller and term (this one's not saved yet are saved first)."""
        await self._flush_events()
        saved = await asyncio.to_thread(self.store.events, since)
        return [e.event.model_copy(update={"controller": e.controller, "term": e.term}) for e in saved]

    async def _flush_events(self) -> None:
        """The events since the last flush into the state database (the decision log
        outlives this controller)."""
        batch = self.event_log.take_unsaved()
        if not batch:
            return
        try:
            await asyncio.to_thread(self.store.save_events, batch)
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            self.event_log.put_back(batch)
            log.warning("events_not_saved", count=len(batch), error=str(exc))

    def _adopt(self, now: float) -> None:
        """The grace has passed: what is loading and serving now is the fleet's."""
        self.adopted = True
        self.metrics.adopted.set(1)
        views = self.views(now)
        self.traffic.adopted((v.model for v in views.values()
                              if v.model is not None and v.state in (WorkerState.READY, WorkerState.LOADING)), now)
        log.info("fleet_adopted", workers=len(views), states=count_states(v.state for v in views.values()),
                 serving=sorted(self.traffic.adopted_serving), unreported=self.fleet.unreported())

    async def settle(self) -> None:
        """Wait for the control calls and launches in flight (tests)."""
        await self.actuator.settle()

    def _tick(self) -> None:
        now = self.clock()
        views = self.views(now)
        snap = Snapshot(workers=tuple(views.values()), activity=self.traffic.take(self.activity(now)),
                        launch_blocked_until=self.actuator.launch_blocked_until(now),
                        model_classes=dict(self.model_classes.classes) if self.model_classes else {},
                        engine_bytes=engine_bytes(self.cfg, self.model_classes),
                        outdated=self.model_admin.outdated(), batch_demand=dict(self.batch_runner.demand))
        t0 = time.perf_counter()
        decisions, self.state = decide(snap, self.state, self.cfg, now)
        self.metrics.tick.observe(time.perf_counter() - t0)
        for d in decisions:
            self.actuator.carry_out(d, snap, views, now)
        self._count_standby_time(views, snap.activity, now)
        self._note_shortfalls()
        export(self.metrics, now, self.cfg, views, self.state, self.actuator.shape_backoff)

    async def _tenant_removed(self, tenant: str, who: str) -> int:
        """A tenant was removed: its keys revoked (how many), its stored responses deleted."""
        revoked = await self.key_admin.revoke_tenant(tenant, who)
        deleted = await asyncio.to_thread(self.responses.delete_tenant, tenant)
        log.info("tenant_responses_deleted", tenant=tenant, responses=deleted)
        return revoked

    async def _purge_responses(self, now: float) -> None:
        """Stored responses past ``responses.retention_days`` go, once an hour."""
        if now - self._responses_purged_at < RESPONSES_PURGE_INTERVAL_S:
            return
        self._responses_purged_at = now
        try:
            gone = await asyncio.to_thread(self.responses.purge, now - self.cfg.responses.retention_days * 86400)
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            log.warning("responses_not_purged", error=str(exc))
            return
        if gone:
            log.info("responses_purged", count=gone, retention_days=self.cfg.responses.retention_days)

    def _count_standby_time(self, views: dict[str, WorkerView], activity: dict[str, ModelActivity],
                            now: float) -> None:
        """Standby instance-seconds since the last tick, idle or lent to batch (counted as
        of this tick, over the time since the one before)."""
        last, self._standby_counted_at = self._standby_counted_at, now
        if last is None or now <= last:
            return
        for shape, (idle, lent) in standby_use(views.values(), activity).items():
            self.standby_seconds[shape] = (self.standby_seconds.get(shape, (0.0, 0.0))[0] + idle * (now - last),
                                           self.standby_seconds.get(shape, (0.0, 0.0))[1] + lent * (now - last))
            self.metrics.standby_seconds.labels(shape, "idle").inc(idle * (now - last))
            self.metrics.standby_seconds.labels(shape, "batch").inc(lent * (now - last))

    def _note_shortfalls(self) -> None:
        """An event each time a pool's budget starts or stops granting less than wanted."""
        for shape, ps in self.state.pools.items():
            g = ps.grant
            short = g.shortfall if g else 0
            if short != self._shortfalls.get(shape, 0):
                self.event_log.record("budget_shortfall", g.reason if g else "ok", shape=shape,
                                      outcome="short" if short else "met",
                                      inputs={"wanted": ps.target.target if ps.target else None,
                                              "granted": g.standby if g else None, "shortfall": short,
                                              "spend_usd_per_hour": g.spend_usd_per_hour if g else None,
                                              "over_budget_serving": g.over_budget_serving if g else False})
                self._shortfalls[shape] = short

    # -- outputs --------------------------------------------------------------------
    def route_table(self, now: float, views: dict[str, WorkerView] | None = None) -> dict[str, ModelRoute]:
        """Ready replicas per model; ``views`` when the caller derived them already."""
        views = self.views(now) if views is None else views
        return route_table(self.cfg, self.facts, views, self.state, now, revisions=self.model_admin.revision,
                           outdated=self.model_admin.outdated())

    def activators(self, now: float) -> int:
        """Activators that reported lately (at least 1: the one asking)."""
        return self.traffic.activators(now)

    async def _publish_routes(self) -> None:
        now = self.clock()
        await self.feed.publish(self.route_table(now), activators=self.activators(now),
                                keys_version=self.key_admin.version, catalog_version=self.model_admin.version)

    async def wait_routes(self, since: int, epoch: str | None, timeout_s: float) -> RouteTable | None:
        """The route table once its version is past ``since`` (at once for a watcher of
        another epoch), or after ``timeout_s``; None before the fleet is adopted."""
        return await self.feed.wait(since, epoch, timeout_s)

    def status(self) -> PoolStatus:
        """The operators' view of the pool (``GET /v1/state``)."""
        now = self.clock()
        act = self.activity(now)
        views = self.views(now)
        return pool_status(now=now, cfg=self.cfg, fleet=self.fleet, views=views,
                           routes=self.route_table(now, views), activity=act, cold_starts=self.cold_starts,
                           shape_backoff=self.actuator.shape_backoff, providers=self.providers, state=self.state,
                           epoch=self.epoch, adopted=self.adopted, standby_seconds=self.standby_seconds,
                           classes=self.model_classes.classes if self.model_classes is not None else None,
                           batch_census=self.batch_runner.census)
