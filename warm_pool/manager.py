"""The pool manager: the control loop, the stateful shell around ``warm_pool.policy.decide.decide``.

Each turn of its loop it takes in what the providers say of their instances
(``warm_pool.fleet.instances``), derives each worker's view from the facts it holds
(``warm_pool.fleet.facts``: the providers', heartbeats, intents), sums the activators'
traffic (``warm_pool.traffic``), calls the policy, carries out its decisions through the
providers and the workers' control API (``warm_pool.fleet.actuator``), publishes the route
table that activators long-poll (``warm_pool.routes``) and exports its metrics
(``warm_pool.metrics``). Its parts (the registry, the operators' admins, the stores, the
lease) are built by ``warm_pool.assembly`` and called by the API directly; the
operators' view of the pool is ``warm_pool.status``'s.

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
from typing import TYPE_CHECKING

from thaw.aio import wait_event
from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.telemetry import shutdown
from thaw.wire import (
    HeartbeatReply,
    ModelRoute,
    PoolEvent,
    PoolStatus,
    WorkerState,
    WorkerStatus,
)
from warm_pool.classes import engine_bytes
from warm_pool.db import StateUnavailable
from warm_pool.fleet.actuator import Actuator
from warm_pool.fleet.facts import FleetFacts
from warm_pool.fleet.instances import InstanceWatch
from warm_pool.fleet.view import count_states
from warm_pool.judging import Judging
from warm_pool.metrics import export
from warm_pool.policy.batch import standby_use
from warm_pool.policy.decide import (
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
)
from warm_pool.routes import RouteFeed, RouteTables
from warm_pool.status import pool_status
from warm_pool.traffic import Traffic

if TYPE_CHECKING:
    from warm_pool.assembly import PoolParts

log = get_logger()

# How often stored responses past their retention are deleted.
RESPONSES_PURGE_INTERVAL_S = 3600.0
# How often, at most, the keep-alive histograms are saved (a crash loses at most this
# much of what they learnt; a clean stop saves them).
KEEPALIVE_SAVE_S = 10.0
# The longest the loop rests after a turn (as long as the turn took, up to this).
TURN_REST_MAX_S = 1.0


class PoolManager:
    """The control loop over the controller's parts (``warm_pool.assembly.build_pool``
    builds both): it leads or follows, adopts the fleet, and each turn decides, acts and
    publishes routes. What it learns of the fleet anew with each term of leading is its
    own: ``fleet`` (facts and heartbeats), ``instances``, ``traffic``, ``actuator``,
    ``routes`` and ``feed`` (the route table, and its long poll), ``judging`` and
    ``state`` (the policy's)."""

    def __init__(self, parts: PoolParts, *, poll_interval_s: float, adopt_grace_s: float,
                 refresh_interval_s: float | None, epoch: str) -> None:
        self.parts = parts
        self.clock = parts.clock
        self.poll_interval_s = poll_interval_s
        self.adopt_grace_s = adopt_grace_s
        self._refresh_interval_s = refresh_interval_s
        self._responses_purged_at = float("-inf")
        # Per shape, standby instance-seconds (idle, lent to batch) since this controller
        # started, and when they were last counted.
        self.standby_seconds: dict[str, tuple[float, float]] = {}
        self._standby_counted_at: float | None = None
        self._fresh_term(epoch)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # Turns of the loop taken (a test waits on it to see that nothing happened).
        self.steps = 0
        self._loop = True

    def _fresh_term(self, epoch: str) -> None:
        """What a controller learns of the fleet anew each time it starts leading: the
        facts, the traffic, the policy's state, the calls in flight and the route feed."""
        p = self.parts
        self.epoch = epoch
        self.state = PolicyState(epoch=epoch, models={
            name: ModelState(idle_histogram=h) for name, h in p.store.load_histograms(self.cfg).items()})
        self._saved_histograms = {n: ms.idle_histogram for n, ms in self.state.models.items()
                                  if ms.idle_histogram.total()}
        self._keepalive_saved_at = float("-inf")
        budgets, clock, wake = p.budgets, p.clock, p.wake.set
        self.fleet = FleetFacts(config=lambda: budgets.cfg, clock=clock, epoch=epoch, metrics=p.metrics, wake=wake)
        self.instances = InstanceWatch(p.providers, self.fleet, clock=clock,
                                       refresh_interval_s=self._refresh_interval_s)
        self.traffic = Traffic(clock=clock, wake=wake)
        self.judging = Judging()
        self.actuator = Actuator(fleet=self.fleet, providers=p.providers, control=p.control,
                                 config=lambda: budgets.cfg, model_classes=p.model_classes, clock=clock,
                                 events=p.event_log, metrics=p.metrics, wake=wake,
                                 refresh_soon=self.instances.refresh_soon, revision_of=p.model_admin.revision,
                                 actions=p.actions, traces=p.start_traces)
        self.feed = RouteFeed(epoch)
        self.routes = RouteTables()
        self.adopt_until: float | None = None
        self.adopted = False
        p.metrics.adopted.set(0)
        self._shortfalls: dict[str, int] = {}

    @property
    def cfg(self) -> ThawConfig:
        """The config in force: the config as written with run-time budget changes."""
        return self.parts.budgets.cfg

    # -- lifecycle ------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """This controller decides (the only one, or the one holding the lease)."""
        return self.parts.leadership is None or self.parts.leadership.leading

    @property
    def leader_url(self) -> str | None:
        """Where the leader is (None: this one leads alone, or nobody leads now)."""
        return self.parts.leadership.leader_url if self.parts.leadership is not None else None

    @property
    def term(self) -> int | None:
        return self.parts.leadership.term if self.parts.leadership is not None else None

    async def start(self, *, loop: bool = True) -> None:
        """Lead at once (the only controller), or once this one holds the lease.
        ``loop=False``: the caller calls :meth:`step`."""
        self._loop = loop
        await self.parts.batch_runner.start()
        if self.parts.leadership is None:
            await self._begin()
        else:
            await self.parts.leadership.start()

    async def _begin(self) -> None:
        """List what the providers run, then start the loop (which decides nothing until
        the adoption grace has passed)."""
        now = self.clock()
        for inst in await self.instances.list_instances():
            self.fleet.observe(inst.worker_id, inst.shape, instance=inst, adopted_at=now)
        self.adopt_until = now + self.adopt_grace_s
        log.info("controller_started", epoch=self.epoch, instances=len(self.fleet.facts),
                 adopt_grace_s=self.adopt_grace_s, term=self.term)
        if self._loop:
            self._task = asyncio.create_task(self._run(), name="pool-manager")

    async def lead(self, term: int) -> None:
        """This controller took the lease: take in what the one before it changed
        (models, tenants, keys, budgets), then adopt the fleet as a restarted one does."""
        p = self.parts
        p.event_log.term = term
        await p.model_admin.refresh()
        await p.key_admin.refresh()
        await p.budgets.reload()
        if self.adopt_until is not None:  # it led before: start over with a new epoch
            self._fresh_term(uuid.uuid4().hex[:8])
        # Its provider actions are written, and its control calls sent, under this term.
        self.actuator.term = term
        p.event_log.record("leader", "elected", outcome="leading",
                           inputs={"controller": p.controller_id, "term": term, "epoch": self.epoch})
        await self._begin()

    async def follow(self) -> None:
        """This controller lost the lease: it acts no more (calls in flight are
        cancelled) and long polls answer now, so their callers find the leader."""
        await self._stop_loop()
        await self.actuator.cancel()
        await self.feed.close()
        self.adopted = False
        self.parts.metrics.adopted.set(0)

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
        await self.parts.batch_runner.close()
        await self._stop_loop()
        await self.feed.close()

    async def close(self) -> None:
        """Stop deciding and hand the lease on. Instances and workers are left as they
        are: the next controller adopts them."""
        p = self.parts
        await self.stop_deciding()
        await self.actuator.cancel()
        await self._flush_events()
        if self.adopted and self.leading:
            await self._save_keepalive(now=True)
        if p.leadership is not None:
            await p.leadership.close()
        await self.instances.close()
        await p.control.close()
        p.key_admin.keys.close()
        p.model_admin.store.close()
        await shutdown(p.start_traces.tracing)

    # -- what outlives a restart -----------------------------------------------------
    async def _save_keepalive(self, *, now: bool = False) -> None:
        """The models' keep-alive histograms into the state database: those that learnt
        something, at most every ``KEEPALIVE_SAVE_S`` (each save writes them all: with
        thousands of models, once per change of any was most of a deploy's cost), and
        at once when ``now`` (a clean stop)."""
        at = self.clock()
        if not now and at - self._keepalive_saved_at < KEEPALIVE_SAVE_S:
            return
        self._keepalive_saved_at = at
        current = {n: ms.idle_histogram for n, ms in self.state.models.items() if ms.idle_histogram.total()}
        if current == self._saved_histograms:
            return
        try:
            await asyncio.to_thread(self.parts.store.save_histograms, self.cfg, current)
            self._saved_histograms = current
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            log.warning("keepalive_state_not_saved", error=str(exc))

    # -- the parts' changes (warm_pool.registry) ------------------------------------------
    async def keys_changed(self) -> None:
        """The key table changed: a route table that carries its new version."""
        if self.feed.table.version > 0:  # before adoption, the first table carries it
            await self._publish_routes()

    async def models_changed(self, cfg: ThawConfig) -> None:
        """The registry changed: the new config in force from the next tick, and a route
        table that tells activators to fetch the catalog."""
        self.parts.budgets.rebase(cfg)
        self.parts.wake.set()
        if self.feed.table.version > 0:
            await self._publish_routes()

    # -- inputs: workers (warm_pool.fleet.facts); activators report to ``traffic`` ----------
    def heartbeat(self, status: WorkerStatus) -> HeartbeatReply:
        """A worker's heartbeat (:meth:`FleetFacts.heartbeat`: raises ``UnknownInstance``),
        answered with this leader's term."""
        known = self.fleet.facts.get(status.worker_id)
        reply = self.fleet.heartbeat(status)
        if self.adopted and (known is None or known.status is None) and status.model is not None \
                and status.state in (WorkerState.READY, WorkerState.LOADING):
            # Serving when first heard, after the adoption (a static pool's worker that
            # reached a new leader late): adopted as those found at the adoption are, its
            # idle grace from now, not let go as a replica never used.
            self.traffic.adopted([status.model], self.clock())
        return reply if self.term is None else reply.model_copy(update={"term": self.term})

    # -- the loop -------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            t0 = time.perf_counter()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool_tick_failed")
            self.steps += 1
            # Woken again at once (every worker's state change wakes it), turns would run
            # back to back and starve the API on the same loop: the heartbeats, demand
            # signals and route polls a burst brings waited seconds behind them. The
            # loop rests as long as its turn took, so turns take at most half of it.
            await asyncio.sleep(min(time.perf_counter() - t0, TURN_REST_MAX_S))
            await wait_event(self.parts.wake, self.poll_interval_s)
            self.parts.wake.clear()

    async def step(self) -> None:
        """One turn of the loop: refresh what the providers say, adopt the fleet once the
        grace has passed, then decide, act and publish routes (a test drives this with
        its own clock)."""
        t0 = time.perf_counter()
        try:
            await self._step()
        finally:
            self.parts.metrics.step.observe(time.perf_counter() - t0)

    async def _step(self) -> None:
        await self.instances.refresh()
        now = self.clock()
        classes = self.parts.model_classes
        if classes is not None and classes.due(self.cfg, now):
            await classes.refresh(self.cfg)
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
        saved = await asyncio.to_thread(self.parts.store.events, since)
        return [e.event.model_copy(update={"controller": e.controller, "term": e.term}) for e in saved]

    async def _flush_events(self) -> None:
        """The events since the last flush into the state database (the decision log
        outlives this controller)."""
        event_log = self.parts.event_log
        batch = event_log.take_unsaved()
        if not batch:
            return
        try:
            await asyncio.to_thread(self.parts.store.save_events, batch)
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            event_log.put_back(batch)
            log.warning("events_not_saved", count=len(batch), error=str(exc))

    def _adopt(self, now: float) -> None:
        """The grace has passed: what is loading and serving now is the fleet's."""
        self.adopted = True
        self.parts.metrics.adopted.set(1)
        views = self.fleet.views(now)
        self.traffic.adopted((v.model for v in views.values()
                              if v.model is not None and v.state in (WorkerState.READY, WorkerState.LOADING)), now)
        log.info("fleet_adopted", workers=len(views), states=count_states(v.state for v in views.values()),
                 serving=sorted(self.traffic.adopted_serving), unreported=self.fleet.unreported())

    def _tick(self) -> None:
        p = self.parts
        now = self.clock()
        views = self.fleet.views(now)
        snap = Snapshot(workers=tuple(views.values()), activity=self.traffic.take(self.traffic.activity(now)),
                        launch_blocked_until=self.actuator.launch_blocked_until(now),
                        model_classes=p.model_classes.classes if p.model_classes else {},
                        engine_bytes=engine_bytes(self.cfg, p.model_classes),
                        outdated=p.model_admin.outdated(), batch_demand=dict(p.batch_runner.demand))
        t0 = time.perf_counter()
        judge = self.judging.select(snap, self.cfg, now)
        decisions, self.state = decide(snap, self.state, self.cfg, now, only=judge)
        self.judging.judged(judge, snap, self.state, decisions, now)
        p.metrics.tick.observe(time.perf_counter() - t0)
        p.metrics.judged.observe(self.judging.last_judged)
        for d in decisions:
            self.actuator.carry_out(d, snap, views, now)
        self._count_standby_time(views, snap.activity, now)
        self._note_shortfalls()
        export(p.metrics, now, self.cfg, views, self.state, self.actuator.shape_backoff)

    async def _purge_responses(self, now: float) -> None:
        """Stored responses past ``responses.retention_days`` go, once an hour."""
        if now - self._responses_purged_at < RESPONSES_PURGE_INTERVAL_S:
            return
        self._responses_purged_at = now
        days = self.cfg.responses.retention_days
        try:
            gone = await asyncio.to_thread(self.parts.responses.purge, now - days * 86400)
        except (OSError, StateUnavailable, sqlite3.Error) as exc:
            log.warning("responses_not_purged", error=str(exc))
            return
        if gone:
            log.info("responses_purged", count=gone, retention_days=days)

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
            self.parts.metrics.standby_seconds.labels(shape, "idle").inc(idle * (now - last))
            self.parts.metrics.standby_seconds.labels(shape, "batch").inc(lent * (now - last))

    def _note_shortfalls(self) -> None:
        """An event each time a pool's budget starts or stops granting less than wanted."""
        for shape, ps in self.state.pools.items():
            g = ps.grant
            short = g.shortfall if g else 0
            if short != self._shortfalls.get(shape, 0):
                self.parts.event_log.record(
                    "budget_shortfall", g.reason if g else "ok", shape=shape, outcome="short" if short else "met",
                    inputs={"wanted": ps.target.target if ps.target else None,
                            "granted": g.standby if g else None, "shortfall": short,
                            "spend_usd_per_hour": g.spend_usd_per_hour if g else None,
                            "over_budget_serving": g.over_budget_serving if g else False})
                self._shortfalls[shape] = short

    # -- outputs --------------------------------------------------------------------
    def route_table(self, now: float, views: dict[str, WorkerView] | None = None) -> dict[str, ModelRoute]:
        """Ready replicas per model; ``views`` when the caller derived them already."""
        views = self.fleet.views(now) if views is None else views
        admin = self.parts.model_admin
        return self.routes.build(self.cfg, self.fleet.facts, views, self.state, now, revisions=admin.revision,
                                 outdated=admin.outdated(), registry_version=admin.version)

    async def _publish_routes(self) -> None:
        now = self.clock()
        await self.feed.publish(self.route_table(now), activators=self.traffic.activators(now),
                                keys_version=self.parts.key_admin.version,
                                catalog_version=self.parts.model_admin.version)

    def status(self) -> PoolStatus:
        """The operators' view of the pool (``GET /v1/state``)."""
        p = self.parts
        now = self.clock()
        act = self.traffic.activity(now)
        views = self.fleet.views(now)
        return pool_status(now=now, cfg=self.cfg, fleet=self.fleet, views=views,
                           routes=self.route_table(now, views), activity=act, cold_starts=self.traffic.cold_starts,
                           shape_backoff=self.actuator.shape_backoff, providers=p.providers, state=self.state,
                           epoch=self.epoch, adopted=self.adopted, standby_seconds=self.standby_seconds,
                           classes=p.model_classes.classes if p.model_classes is not None else None,
                           batch_census=p.batch_runner.census)
