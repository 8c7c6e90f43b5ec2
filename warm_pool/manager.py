"""The pool manager: the stateful shell around ``warm_pool.policy.decide``.

It records facts (the providers' instances, workers' heartbeats, activators' traffic
reports, the control calls it made), derives each worker's view from them
(``warm_pool.view``), calls the policy, carries out its decisions through the
providers and :class:`~warm_pool.control.WorkerControl`, and publishes the route table
(ready replicas per model, plus why a model is failing) that activators long-poll.

A restart does no harm: on start it lists the providers' instances, waits one
heartbeat interval (``adopt_grace_s``) for their workers to report, adopts what is
loading and serving, and only then decides or publishes routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from thaw.aio import wait_event
from thaw.config import Model, ThawConfig
from thaw.fit import engine_memory
from thaw.log import get_logger
from thaw.wire import (
    AdapterRequest,
    AdapterUnload,
    AssignRequest,
    BudgetChange,
    BudgetView,
    ColdStartRecord,
    HeartbeatReply,
    KeyTable,
    ModelRoute,
    ModelRow,
    NewKeyReply,
    Phases,
    PoolEvent,
    PoolStatus,
    PrebuildRequest,
    ReleaseRequest,
    ReplicaRoute,
    RevokeReply,
    RouteTable,
    ShapeRow,
    SleepRequest,
    WorkerDetail,
    WorkerRow,
    WorkerState,
    WorkerStatus,
)
from warm_pool.classes import ModelClasses
from warm_pool.control import ControlError, WorkerControl
from warm_pool.keys import KEYS_FILE, KeyStore
from warm_pool.persist import (
    BudgetRefused,
    ControllerStore,
    apply_budget,
    budget_view,
    merge_budget_change,
)
from warm_pool.policy import (
    Assign,
    Decision,
    Launch,
    LoadAdapter,
    ModelActivity,
    ModelState,
    Pack,
    PolicyState,
    Prebuild,
    Release,
    Sleep,
    Snapshot,
    Start,
    Stop,
    Terminate,
    UnloadAdapter,
    WorkerView,
    decide,
    kept_classes,
    launch_backoff_s,
)
from warm_pool.providers import CapacityError, Instance, Provider
from warm_pool.view import INTENT_TTL_S, Intent, WorkerFacts, derive_view

log = get_logger()

REPORT_TTL_S = 10.0
EVENTS_KEPT = 5000
# Launch failures other than capacity (API errors) pause a shape this long, doubling.
LAUNCH_ERROR_BACKOFF_S = (5.0, 120.0)
# A worker that refused a packed engine takes none for this long (its accounting and
# the controller's disagree until its next heartbeats settle it).
PACK_REFUSED_S = 30.0


class UnknownInstance(Exception):
    """A heartbeat from an instance that no provider of this cluster launched (403)."""


class UnknownTenant(LookupError):
    """A key for a tenant the config does not declare (404)."""


class UnknownKey(LookupError):
    """A revocation that matches no active key (404)."""


@dataclass
class _Report:
    at: float
    models: dict[str, ModelActivity]


@dataclass(frozen=True)
class _ShapeBackoff:
    failures: int
    until: float
    reason: str


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge("thaw_pool_workers", "Workers by shape and state", ["shape", "state"], registry=registry)
        self.decisions = Counter("thaw_pool_decisions_total", "Policy decisions carried out", ["kind", "reason"], registry=registry)
        self.tick = Histogram("thaw_pool_policy_seconds", "Time spent in one policy decision", registry=registry,
                              buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1))
        self.backoff = Gauge("thaw_model_backoff_seconds", "Seconds left in a model's load backoff", ["model"], registry=registry)
        self.launch_backoff = Gauge("thaw_pool_launch_backoff_seconds",
                                    "Seconds left before a shape launches again (capacity errors)", ["shape"],
                                    registry=registry)
        self.launch_failures = Counter("thaw_pool_launch_failures_total", "Launches that failed, by shape and cause",
                                       ["shape", "cause"], registry=registry)
        self.heartbeats = Counter("thaw_pool_heartbeats_total", "Worker heartbeats, by outcome", ["outcome"],
                                  registry=registry)
        self.adopted = Gauge("thaw_pool_adopted", "1 once the controller has adopted the fleet after its start",
                             registry=registry)
        # The autoscaler's inputs and outputs, per model.
        self.desired = Gauge("thaw_autoscaler_desired_replicas",
                             "Replicas per stage: raw (demand, TTFT), bounded, target (after delays)",
                             ["model", "stage"], registry=registry)
        self.demand = Gauge("thaw_autoscaler_demand", "Mean requests queued or in flight over a window",
                            ["model", "window"], registry=registry)
        self.arrival_rate = Gauge("thaw_autoscaler_arrivals_per_second", "Arrivals over the stable window",
                                  ["model"], registry=registry)
        self.ttft_p90 = Gauge("thaw_autoscaler_ttft_p90_seconds", "Hot requests' TTFT p90 over the stable window",
                              ["model"], registry=registry)
        self.panic = Gauge("thaw_autoscaler_panic", "1 while the model is in panic mode", ["model"], registry=registry)
        self.keep_alive = Gauge("thaw_keepalive_window_seconds",
                                "The keep-alive window from the idle start: prewarm (-1: none) and keep_until",
                                ["model", "edge"], registry=registry)
        self.standby_target = Gauge("thaw_pool_standby_target",
                                    "The standby sizer's target, its raw demand and watermarks, and the grant",
                                    ["shape", "value"], registry=registry)
        self.shortfall = Gauge("thaw_pool_budget_shortfall_instances",
                               "Standby instances wanted but not granted by a budget", ["shape"], registry=registry)
        self.spend = Gauge("thaw_pool_spend_usd_per_hour", "Serving + asleep + standby spend", ["shape"],
                           registry=registry)
        self.keep_alive_mode = Gauge("thaw_keepalive_histogram_in_use",
                                     "1 when the histogram policy decides, 0 when it falls back to fixed",
                                     ["model"], registry=registry)


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
    ) -> None:
        """``providers`` maps each pool's shape to the provider that runs it.
        ``state_dir``: where what must outlive a restart is kept (None: nowhere).
        ``model_classes``: each model's engine class (placement into pre-built
        engines); None: no model has a known class."""
        self.cfg = cfg
        self.providers = providers
        self.control = control
        self.model_classes = model_classes
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        # One heartbeat interval and a margin: long enough for every live worker to report.
        self.adopt_grace_s = (cfg.cluster.heartbeat_interval_s * 1.5 + 0.5) if adopt_grace_s is None else adopt_grace_s
        # How often the providers are asked what exists: a local process list is cheap; a
        # DescribeInstances per second would spend the account's EC2 API budget.
        if refresh_interval_s is None:
            refresh_interval_s = 1.0 if all(p.kind == "local" for p in providers.values()) else 10.0
        self.refresh_interval_s = refresh_interval_s
        self.epoch = epoch or uuid.uuid4().hex[:8]
        self.registry = registry or CollectorRegistry()
        self.metrics = PoolMetrics(self.registry)
        self.store = ControllerStore(state_dir)
        # The config as written; self.cfg is it with the operators' run-time budget
        # changes applied (persisted in state_dir, so a restart keeps them).
        self.base_cfg = cfg
        self.budget_overrides: dict[str, Any] = self.store.load_budget()
        try:
            self.cfg = apply_budget(cfg, self.budget_overrides)
        except BudgetRefused as exc:  # e.g. the config file changed under them
            log.warning("budget_overrides_dropped", error=str(exc))
            self.budget_overrides = {}
        self.keys = KeyStore(state_dir / KEYS_FILE if state_dir is not None else None)
        if state_dir is not None:
            # An older Thaw kept run-time keys beside its one ledger: take them in once.
            legacy = cfg.data_dir / "usage.db"
            if (n := self.keys.import_legacy(legacy)):
                log.info("keys_imported", count=n, source=str(legacy))
        self.keys_version = self.keys.version
        self.state = PolicyState(epoch=self.epoch, models={
            name: ModelState(idle_histogram=h) for name, h in self.store.load_histograms(self.cfg).items()})
        self._saved_histograms = {n: ms.idle_histogram for n, ms in self.state.models.items()}
        self.facts: dict[str, WorkerFacts] = {}
        # Workers being terminated: their last heartbeats must not bring them back.
        self.gone: set[str] = set()
        # Packed engines that went away (their ids are never reused): the same.
        self.released_engines: set[str] = set()
        # Workers that refused a packed engine, and when.
        self._pack_refused: dict[str, float] = {}
        self.reports: dict[str, _Report] = {}
        self.demand_at: dict[str, float] = {}
        self._arrivals_seen: dict[tuple[str, str], int] = {}
        self._new_arrivals: dict[str, int] = {}
        self._new_ttfts: dict[str, list[float]] = {}
        self.cold_starts: dict[str, ColdStartRecord] = {}
        self.shape_backoff: dict[str, _ShapeBackoff] = {}
        self.events: deque[PoolEvent] = deque(maxlen=EVENTS_KEPT)
        self.adopt_until: float | None = None
        self.adopted = False
        # Models found serving at adoption, and when (see step()).
        self.adopted_serving: dict[str, float] = {}
        self.routes = RouteTable(epoch=self.epoch, version=0, models={})
        self._routes_changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight_ops: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()  # workers with a control call in flight
        self._refreshed_at = 0.0
        self._closing = False
        self._shortfalls: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------
    async def start(self, *, loop: bool = True) -> None:
        """List what the providers run, then start the loop (which decides nothing until
        the adoption grace has passed). ``loop=False``: the caller calls :meth:`step`."""
        now = self.clock()
        for inst in await self._list_instances():
            self._observe(inst.worker_id, inst.shape, instance=inst, adopted_at=now)
        self.adopt_until = now + self.adopt_grace_s
        log.info("controller_started", epoch=self.epoch, instances=len(self.facts),
                 adopt_grace_s=self.adopt_grace_s)
        if loop:
            self._task = asyncio.create_task(self._run(), name="pool-manager")

    async def stop_deciding(self) -> None:
        """The first step of a shutdown: no more decisions (heartbeats stop arriving as the
        server closes, and silence must not read as dead workers), and long polls answer
        now instead of holding the shutdown up."""
        self._closing = True
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._routes_changed:
            self._routes_changed.notify_all()

    async def close(self) -> None:
        """Stop deciding. Instances and workers are left as they are: the next controller
        adopts them."""
        await self.stop_deciding()
        for t in list(self._inflight_ops):
            t.cancel()
        await asyncio.gather(*self._inflight_ops, return_exceptions=True)
        for p in self._unique_providers():
            await p.close()
        await self.control.close()
        self.keys.close()

    def _unique_providers(self) -> list[Provider]:
        out: list[Provider] = []
        for p in self.providers.values():
            if all(p is not q for q in out):
                out.append(p)
        return out

    async def _list_instances(self) -> list[Instance]:
        found: list[Instance] = []
        for p in self._unique_providers():
            try:
                found.extend(await p.instances())
            except Exception:
                log.exception("provider_list_failed", provider=p.kind)
        return found

    # -- what outlives a restart -----------------------------------------------------
    async def _save_keepalive(self) -> None:
        current = {n: ms.idle_histogram for n, ms in self.state.models.items()}
        if self.store.state_dir is None or current == self._saved_histograms:
            return
        try:
            await asyncio.to_thread(self.store.save_histograms, self.cfg, current)
            self._saved_histograms = current
        except OSError as exc:
            log.warning("keepalive_state_not_saved", error=str(exc))

    # -- budgets changed at run time ---------------------------------------------------
    def budget_view(self) -> BudgetView:
        return budget_view(self.cfg, self.budget_overrides)

    async def change_budget(self, change: BudgetChange, who: str) -> BudgetView:
        """Apply an operator's budget change: validated, persisted, in force from the next
        tick, and recorded as an event naming who asked."""
        overrides = merge_budget_change(self.budget_overrides, change, self.base_cfg)
        cfg = apply_budget(self.base_cfg, overrides)
        before = self.budget_view()
        await asyncio.to_thread(self.store.save_budget, overrides)
        self.cfg, self.budget_overrides = cfg, overrides
        after = self.budget_view()
        self._event(None, "budget", "operator", shape=change.shape, outcome="done",
                    inputs={"who": who, "change": change.model_dump(exclude_none=True),
                            "before": before.model_dump(), "after": after.model_dump()})
        self._wake.set()
        return after

    # -- API keys -------------------------------------------------------------------
    async def add_key(self, tenant: str, label: str | None, who: str) -> NewKeyReply:
        """A new key for a tenant of the config; every activator takes it within a second."""
        tenants = sorted(t.name for t in self.base_cfg.tenants)
        if tenant not in tenants:
            raise UnknownTenant(f"no tenant {tenant!r} in the config; declared: {tenants}")
        key, row = await asyncio.to_thread(self.keys.add, tenant, label)
        self._event(None, "key", "operator", outcome="added",
                    inputs={"who": who, "tenant": tenant, "prefix": row.prefix, "label": label})
        await self._keys_changed()
        return NewKeyReply(key=key, row=row)

    async def revoke_key(self, key: str, who: str) -> RevokeReply:
        """Revoke a key (the key, its hash, or its listed prefix), a config file's keys too."""
        config_keys = {h.removeprefix("sha256:"): t.name for t in self.base_cfg.tenants for h in t.api_key_hashes}
        n = await asyncio.to_thread(self.keys.revoke, key, config_keys=config_keys)
        if n == 0:
            raise UnknownKey("no such active key (give the key, its sha256, or the prefix `thaw tenants ls` shows)")
        self._event(None, "key", "operator", outcome="revoked", inputs={"who": who, "count": n})
        await self._keys_changed()
        return RevokeReply(revoked=n, version=self.keys_version)

    async def key_table(self) -> KeyTable:
        return await asyncio.to_thread(self.keys.table)

    async def _keys_changed(self) -> None:
        self.keys_version = await asyncio.to_thread(lambda: self.keys.version)
        if self.routes.version > 0:  # before adoption, the first table carries it
            await self._publish_routes()

    # -- facts (the one place they change) -----------------------------------------
    def _observe(self, worker_id: str, shape: str, **changes: Any) -> WorkerFacts:
        cur = self.facts.get(worker_id) or WorkerFacts(worker_id, shape)
        new = replace(cur, **changes)
        self.facts[worker_id] = new
        return new

    def _forget(self, worker_id: str) -> None:
        self.facts.pop(worker_id, None)

    # -- inputs ---------------------------------------------------------------------
    def heartbeat(self, status: WorkerStatus) -> HeartbeatReply:
        """A worker's heartbeat. Raises :class:`UnknownInstance` for an instance no
        provider here launched (a worker on a local pool may register itself)."""
        now = self.clock()
        if status.worker_id in self.gone or status.worker_id in self.released_engines:
            self.metrics.heartbeats.labels("gone").inc()
            raise UnknownInstance(f"worker {status.worker_id!r} is being terminated")
        if status.host_worker_id is not None:
            return self._engine_heartbeat(status, now)
        f = self.facts.get(status.worker_id)
        if f is None:
            f = next((x for x in self.facts.values()
                      if x.instance is not None and x.instance.instance_id == status.instance_id), None)
        if f is None or (f.instance is not None and f.instance.instance_id != status.instance_id):
            pool = self.cfg.pool(status.shape)
            if pool is None or pool.provider != "local":
                self.metrics.heartbeats.labels("refused").inc()
                raise UnknownInstance(
                    f"instance {status.instance_id!r} (worker {status.worker_id!r}) was not launched by this "
                    f"cluster's providers")
            log.info("worker_registered", worker_id=status.worker_id, instance_id=status.instance_id,
                     shape=status.shape, control_url=status.control_url)
        prev = f.status if f is not None else None
        self._observe(status.worker_id, status.shape, status=status, heard_at=now)
        self._prune_engines(status.worker_id, status, now)
        self.metrics.heartbeats.labels("accepted").inc()
        if prev is None or prev.state != status.state or prev.engine_url != status.engine_url \
                or prev.adapters != status.adapters:
            self._wake.set()
        return HeartbeatReply(controller_epoch=self.epoch, interval_s=self.cfg.cluster.heartbeat_interval_s)

    def _engine_heartbeat(self, status: WorkerStatus, now: float) -> HeartbeatReply:
        """A packed engine's heartbeat: accepted while the worker it runs in is known here
        (same instance); a restarted controller learns its packed engines this way."""
        host_id = status.host_worker_id
        assert host_id is not None
        host = self.facts.get(host_id)
        host_instance = (host.instance.instance_id if host is not None and host.instance is not None
                         else host.status.instance_id if host is not None and host.status is not None else None)
        if host is None or host_instance != status.instance_id:
            self.metrics.heartbeats.labels("refused").inc()
            raise UnknownInstance(f"packed engine {status.worker_id!r} runs in worker {host_id!r}, which this "
                                  f"controller does not know (yet) on instance {status.instance_id!r}")
        prev = self.facts.get(status.worker_id)
        self._observe(status.worker_id, status.shape, status=status, heard_at=now, host=host_id)
        self.metrics.heartbeats.labels("accepted").inc()
        if prev is None or prev.status is None or prev.status.state != status.state \
                or prev.status.engine_url != status.engine_url or prev.status.adapters != status.adapters:
            self._wake.set()
        return HeartbeatReply(controller_epoch=self.epoch, interval_s=self.cfg.cluster.heartbeat_interval_s)

    def _prune_engines(self, host_id: str, status: WorkerStatus, now: float) -> None:
        """Forget the packed engines a worker no longer lists (released and gone), but
        not one just asked for, which it may not have listed yet."""
        listed = set(status.engines)
        for wid, f in list(self.facts.items()):
            if f.host != host_id or wid in listed or wid in self._busy:
                continue
            i = f.intent
            if i is not None and i.kind == "assign" and now - i.at < INTENT_TTL_S:
                continue
            log.info("packed_engine_gone", worker_id=wid, host=host_id)
            self._forget(wid)
            self.released_engines.add(wid)
            self._wake.set()
    def report(self, activator_id: str, models: dict[str, ModelActivity], arrivals: dict[str, int] | None = None,
               ttfts: dict[str, list[float]] | None = None) -> None:
        """An activator's traffic. ``arrivals`` are its counters (requests accepted since
        it started): the differences since its last report are new arrivals."""
        self.reports[activator_id] = _Report(self.clock(), models)
        for name, count in (arrivals or {}).items():
            seen = self._arrivals_seen.get((activator_id, name))
            # The first report from an activator sets the baseline: after a controller
            # restart its counter holds everything since it started, not new arrivals.
            # A counter that went down: the activator restarted and counts from zero.
            new = 0 if seen is None else count - seen if count >= seen else count
            self._arrivals_seen[(activator_id, name)] = count
            self._new_arrivals[name] = self._new_arrivals.get(name, 0) + new
        for name, samples in (ttfts or {}).items():
            self._new_ttfts.setdefault(name, []).extend(samples)
        if any(a.queued for a in models.values()):
            self._wake.set()

    def _take_traffic(self, activity: dict[str, ModelActivity]) -> dict[str, ModelActivity]:
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
        self._wake.set()

    def record_cold_start(self, record: ColdStartRecord) -> None:
        self.cold_starts[record.model] = record

    def activity(self, now: float) -> dict[str, ModelActivity]:
        out: dict[str, ModelActivity] = {}
        for rid, rep in list(self.reports.items()):
            if now - rep.at > REPORT_TTL_S:
                del self.reports[rid]
                continue
            for name, a in rep.models.items():
                cur = out.get(name, ModelActivity())
                last = max(filter(None, (cur.last_request_at, a.last_request_at)), default=None)
                out[name] = ModelActivity(cur.queued + a.queued, cur.in_flight + a.in_flight, last)
        for name, at in self.adopted_serving.items():
            cur = out.get(name, ModelActivity())
            last = max(filter(None, (cur.last_request_at, at)), default=None)
            out[name] = ModelActivity(cur.queued, cur.in_flight, last)
        for name, at in self.demand_at.items():
            cur = out.get(name, ModelActivity())
            # A demand signal counts as one queued request until a report covers it.
            recent = now - at < 2.0 and not cur.queued
            last = max(filter(None, (cur.last_request_at, at)), default=None)
            out[name] = ModelActivity(cur.queued + (1 if recent else 0), cur.in_flight, last)
        return out

    # -- the derived view -----------------------------------------------------------
    def views(self, now: float) -> dict[str, WorkerView]:
        timeout = self.cfg.cluster.worker_timeout_s
        heard = [f.heard_at for f in self.facts.values() if f.heard_at is not None]
        if heard and now - max(heard) > timeout:
            # Not one worker heard from in that time: more likely this controller is cut
            # off (or was stalled) than every worker dead. Silence proves nothing now; the
            # providers still report exits and stops.
            timeout = float("inf")
        out = {}
        for wid, f in self.facts.items():
            shape = self.cfg.shape(f.shape)
            v = derive_view(f, now, boot_timeout_s=shape.boot_timeout_s if shape else 600.0,
                            worker_timeout_s=timeout)
            if v.capacity_bytes and now - self._pack_refused.get(wid, -PACK_REFUSED_S) < PACK_REFUSED_S:
                v = replace(v, capacity_bytes=0)
            out[wid] = v
        return out

    # -- the loop -------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool_tick_failed")
            await wait_event(self._wake, self.poll_interval_s)
            self._wake.clear()

    async def step(self) -> None:
        """One turn of the loop: refresh what the providers say, adopt the fleet once the
        grace has passed, then decide, act and publish routes (a test drives this with
        its own clock)."""
        await self._refresh_instances()
        now = self.clock()
        if self.model_classes is not None and self.model_classes.due(self.cfg, now):
            await self.model_classes.refresh(self.cfg)
        if not self.adopted and self.adopt_until is not None and now >= self.adopt_until:
            self.adopted = True
            self.metrics.adopted.set(1)
            views = self.views(now)
            # A model found serving counts as used just now: its idle grace starts at the
            # adoption, so no replica is released because the controller restarted (the
            # activators' reports that say otherwise may not have arrived yet).
            for v in views.values():
                if v.model is not None and v.state in (WorkerState.READY, WorkerState.LOADING):
                    self.adopted_serving[v.model] = now
            log.info("fleet_adopted", workers=len(views), states=_count(v.state for v in views.values()),
                     serving=sorted(self.adopted_serving))
        if self.adopted:
            self._tick()
            await self._publish_routes()
            await self._save_keepalive()

    async def settle(self) -> None:
        """Wait for the control calls and launches in flight (tests)."""
        while self._inflight_ops:
            await asyncio.gather(*list(self._inflight_ops), return_exceptions=True)

    async def _refresh_instances(self) -> None:
        """What the providers say of the machines: exits, stops, instances gone."""
        now = self.clock()
        if now - self._refreshed_at < self.refresh_interval_s:
            return
        self._refreshed_at = now
        listed = {i.worker_id: i for i in await self._list_instances()}
        for wid, f in list(self.facts.items()):
            inst = listed.get(wid)
            if inst is not None:
                if inst != f.instance:
                    self._observe(wid, f.shape, instance=inst)
            elif f.instance is not None and f.launch_requested_at is None and wid not in self._busy:
                # The provider no longer has it (terminated outside Thaw).
                log.warning("instance_vanished", worker_id=wid, instance_id=f.instance.instance_id)
                self._forget(wid)

    def _tick(self) -> None:
        now = self.clock()
        views = self.views(now)
        blocked = {s: b.until for s, b in self.shape_backoff.items() if b.until > now}
        snap = Snapshot(workers=tuple(views.values()), activity=self._take_traffic(self.activity(now)),
                        launch_blocked_until=blocked,
                        model_classes=dict(self.model_classes.classes) if self.model_classes else {},
                        engine_bytes=self._engine_bytes())
        t0 = time.perf_counter()
        decisions, self.state = decide(snap, self.state, self.cfg, now)
        self.metrics.tick.observe(time.perf_counter() - t0)
        for d in decisions:
            self._carry_out(d, snap, views, now)
        for shape, ps in self.state.pools.items():
            g = ps.grant
            short = g.shortfall if g else 0
            if short != self._shortfalls.get(shape, 0):
                self._event(None, "budget_shortfall", g.reason if g else "ok", shape=shape,
                            outcome="short" if short else "met",
                            inputs={"wanted": ps.target.target if ps.target else None,
                                    "granted": g.standby if g else None, "shortfall": short,
                                    "spend_usd_per_hour": g.spend_usd_per_hour if g else None,
                                    "over_budget_serving": g.over_budget_serving if g else False})
                self._shortfalls[shape] = short
        self._export(now, views)

    def _engine_bytes(self) -> dict[str, int]:
        """The memory an engine of each model of a packing pool holds, where its size is
        known (thaw.fit.engine_memory)."""
        sizes = self.model_classes.sizes if self.model_classes is not None else {}
        out = {}
        for m in self.cfg.models:
            pool, shape = self.cfg.pool(m.shape), self.cfg.shape(m.shape)
            if pool is not None and pool.pack and shape is not None and m.name in sizes and m.base is None:
                out[m.name] = engine_memory(sizes[m.name], m.engine, shape)
        return out

    def _event(self, d: Decision | None, kind: str, reason: str, *, outcome: str = "started",
               worker_id: str | None = None, model: str | None = None, shape: str | None = None,
               inputs: dict[str, Any] | None = None) -> None:
        ev = PoolEvent(at=self.clock(), kind=kind, reason=reason, worker_id=worker_id, model=model, shape=shape,
                       outcome=outcome, inputs=inputs or {})
        self.events.append(ev)
        log.info("pool_decision" if d is not None else "pool_event", **ev.model_dump(exclude_none=True))

    def _inputs(self, snap: Snapshot, views: dict[str, WorkerView], model: str | None, shape: str | None) -> dict[str, Any]:
        """What led to a decision: the model's traffic and the worker states behind it."""
        out: dict[str, Any] = {}
        if model is not None:
            a = snap.activity.get(model, ModelActivity())
            out["activity"] = {"queued": a.queued, "in_flight": a.in_flight, "last_request_at": a.last_request_at}
            out["replicas"] = _count(v.state for v in views.values() if v.model == model)
        if shape is not None:
            out["shape_workers"] = _count(v.state for v in views.values() if v.shape == shape)
        return out

    def _carry_out(self, d: Decision, snap: Snapshot, views: dict[str, WorkerView], now: float) -> None:
        kind = type(d).__name__.lower()
        reason = getattr(d, "reason", "demand")
        self.metrics.decisions.labels(kind, reason).inc()
        wid = getattr(d, "worker_id", None)
        model = getattr(d, "model", None)
        shape = d.shape if isinstance(d, Launch) else (views[wid].shape if wid in views else None)
        self._event(d, kind, reason, worker_id=wid, model=model, shape=shape,
                    inputs=self._inputs(snap, views, model, shape))
        if isinstance(d, Launch):
            worker_id = f"w-{uuid.uuid4().hex[:10]}"
            self._observe(worker_id, d.shape, launch_requested_at=now)
            self._spawn(self._launch(worker_id, d.shape), busy=worker_id)
        elif isinstance(d, Assign):
            f = self.facts[d.worker_id]
            self._observe(d.worker_id, f.shape, intent=Intent("assign", now, d.model, d.assignment_id,
                                                              memory_bytes=snap.engine_bytes.get(d.model, 0)))
            self._spawn(self._assign(d), busy=d.worker_id)
        elif isinstance(d, LoadAdapter | UnloadAdapter):
            f = self.facts[d.worker_id]
            intent = (Intent("adapter_load", now, d.model, None) if isinstance(d, LoadAdapter)
                      else Intent("adapter_unload", now, d.model, None))
            intents = tuple(i for i in f.adapter_intents if i.model != d.model and now - i.at < INTENT_TTL_S)
            self._observe(d.worker_id, f.shape, adapter_intents=(*intents, intent))
            self._spawn(self._adapter_call(d))
        elif isinstance(d, Pack):
            f = self.facts[d.worker_id]
            self._observe(d.engine_id, f.shape, host=d.worker_id,
                          intent=Intent("assign", now, d.model, d.assignment_id, memory_bytes=d.memory_bytes))
            self._spawn(self._pack(d), busy=d.engine_id)
        elif isinstance(d, Release):
            f = self.facts[d.worker_id]
            self._observe(d.worker_id, f.shape, intent=Intent("release", now, d.model, views[d.worker_id].assignment_id))
            self._spawn(self._release(d.worker_id), busy=d.worker_id)
        elif isinstance(d, Sleep):
            f = self.facts[d.worker_id]
            self._observe(d.worker_id, f.shape, intent=Intent("sleep", now, d.model, views[d.worker_id].assignment_id))
            self._spawn(self._sleep(d), busy=d.worker_id)
        elif isinstance(d, Prebuild):
            f = self.facts[d.worker_id]
            self._observe(d.worker_id, f.shape, intent=Intent("prebuild", now, d.model, None, d.engine_class))
            self._spawn(self._prebuild(d), busy=d.worker_id)
        elif isinstance(d, Stop | Start):
            f = self.facts[d.worker_id]
            intent = Intent("stop", now, None, None) if isinstance(d, Stop) else Intent("start", now, None, None)
            self._observe(d.worker_id, f.shape, intent=intent)
            self._spawn(self._stop_or_start(d), busy=d.worker_id)
        elif isinstance(d, Terminate) and d.worker_id in self.facts and self.facts[d.worker_id].host is not None:
            # A packed engine that stopped reporting: it has no instance to terminate.
            self._forget(d.worker_id)
            self.released_engines.add(d.worker_id)
        elif isinstance(d, Terminate):
            gone = self.facts.get(d.worker_id)
            self._forget(d.worker_id)
            for wid, f in list(self.facts.items()):
                if f.host == d.worker_id:  # its packed engines go with its instance
                    self._forget(wid)
                    self.released_engines.add(wid)
            self.gone.add(d.worker_id)
            if gone is not None:
                self._spawn(self._terminate(gone))

    def _spawn(self, coro: Coroutine[Any, Any, None], busy: str | None = None) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("pool_action_failed")
            finally:
                if busy:
                    self._busy.discard(busy)
                self._wake.set()

        if busy:
            self._busy.add(busy)
        task = asyncio.create_task(run())
        self._inflight_ops.add(task)
        task.add_done_callback(self._inflight_ops.discard)

    def _control_url(self, worker_id: str) -> str | None:
        f = self.facts.get(worker_id)
        if f is None:
            return None
        if f.status is not None:
            return f.status.control_url
        if f.host is not None:
            host = self._control_url(f.host)
            return None if host is None else f"{host.rstrip('/')}/engines/{worker_id}"
        return f.instance.control_url if f.instance is not None else None

    async def _launch(self, worker_id: str, shape: str) -> None:
        provider = self.providers.get(shape)
        if provider is None:
            self._forget(worker_id)
            log.error("no_provider", shape=shape)
            return
        try:
            inst = await provider.launch(shape, worker_id)
        except CapacityError as exc:
            self._forget(worker_id)
            self._launch_failed(shape, "capacity", str(exc), worker_id)
            return
        except Exception as exc:
            self._forget(worker_id)
            self._launch_failed(shape, "error", f"{type(exc).__name__}: {exc}", worker_id)
            return
        self.shape_backoff.pop(shape, None)
        self._observe(worker_id, shape, instance=inst, launch_requested_at=None)
        self._event(None, "launched", "provider", worker_id=worker_id, shape=shape, outcome="done",
                    inputs={"instance_id": inst.instance_id, **dict(inst.detail)})

    def _launch_failed(self, shape: str, cause: str, message: str, worker_id: str) -> None:
        prev = self.shape_backoff.get(shape)
        failures = (prev.failures if prev else 0) + 1
        pool = self.cfg.pool(shape)
        if cause == "capacity" and pool is not None and pool.ec2 is not None:
            base, cap = pool.ec2.backoff_base_s, pool.ec2.backoff_max_s
        else:
            base, cap = LAUNCH_ERROR_BACKOFF_S
        pause = launch_backoff_s(failures, base, cap)
        self.shape_backoff[shape] = _ShapeBackoff(failures, self.clock() + pause, message)
        self.metrics.launch_failures.labels(shape, cause).inc()
        log.warning("launch_failed", shape=shape, cause=cause, error=message, failures=failures, backoff_s=pause)
        self._event(None, "launch", cause, worker_id=worker_id, shape=shape, outcome="failed",
                    inputs={"error": message, "failures": failures, "backoff_s": pause})

    def _control_failed(self, worker_id: str, what: str, exc: ControlError) -> None:
        f = self.facts.get(worker_id)
        if f is not None:
            self._observe(worker_id, f.shape, intent=None)  # the next heartbeat is the truth
        log.warning(f"{what}_refused", worker_id=worker_id, status=exc.status, error=str(exc))

    def _answered(self, worker_id: str, status: WorkerStatus) -> None:
        f = self.facts.get(worker_id)
        if f is not None and worker_id not in self.gone:
            self._observe(worker_id, f.shape, status=status, heard_at=self.clock())

    async def _call(self, worker_id: str, what: str,
                    call: Callable[[str], Awaitable[WorkerStatus]]) -> WorkerStatus | None:
        """One control call to a worker (``call(control_url)``); its answer is taken in as
        the worker's status. None when it did not take effect (logged, intent cleared)."""
        url = self._control_url(worker_id)
        if url is None:
            self._control_failed(worker_id, what, ControlError("no control URL yet"))
            return None
        try:
            status = await call(url)
        except ControlError as exc:
            self._control_failed(worker_id, what, exc)
            return None
        self._answered(worker_id, status)
        return status

    def _assign_request(self, model: Model, assignment_id: str) -> AssignRequest:
        return AssignRequest(
            assignment_id=assignment_id, model=model.name, uri=model.uri,
            served_model_name=model.resolved_served_name, max_model_len=model.max_context_tokens,
            # With vLLM's LoRA flags when it has adapters.
            engine=self.cfg.engine_args(model),
            # The asleep tier needs the engine started with sleep mode.
            sleep_mode=model.autoscaling.asleep_ttl_s > 0,
            # Named only for a model whose engine is kept (a class its pool pre-builds).
            engine_class=kept_classes(self.cfg, self.model_classes.classes).get(model.name)
            if self.model_classes else None,
            # Counted by a worker that packs engines (None: not counted).
            memory_bytes=self._engine_bytes().get(model.name),
        )

    async def _assign(self, d: Assign) -> None:
        model = self.cfg.model(d.model)
        assert model is not None
        req = self._assign_request(model, d.assignment_id)
        if await self._call(d.worker_id, "assign", lambda url: self.control.assign(url, req)) is not None:
            log.info("worker_assigned", worker_id=d.worker_id, model=model.name, assignment_id=d.assignment_id,
                     expected_tier=d.tier, expected_load_s=d.expected_load_s)

    async def _pack(self, d: Pack) -> None:
        """Ask the worker for a packed engine; its answer is the new engine's status."""
        model = self.cfg.model(d.model)
        assert model is not None
        req = self._assign_request(model, d.assignment_id).model_copy(
            update={"engine_id": d.engine_id, "memory_bytes": d.memory_bytes})
        url = self._control_url(d.worker_id)
        try:
            if url is None:
                raise ControlError("no control URL yet")
            status = await self.control.pack(url, req)
        except ControlError as exc:
            # Never started: the engine is forgotten, and this worker takes no other for a while.
            self._forget(d.engine_id)
            self._pack_refused[d.worker_id] = self.clock()
            log.warning("pack_refused", worker_id=d.worker_id, engine_id=d.engine_id, model=d.model,
                        status=exc.status, error=str(exc))
            self._event(None, "pack", "refused", worker_id=d.worker_id, model=d.model, outcome="failed",
                        inputs={"error": str(exc), "memory_bytes": d.memory_bytes})
            return
        self._answered(d.engine_id, status)
        log.info("engine_packed", worker_id=d.worker_id, engine_id=d.engine_id, model=model.name,
                 assignment_id=d.assignment_id, memory_bytes=d.memory_bytes)

    async def _adapter_call(self, d: LoadAdapter | UnloadAdapter) -> None:
        """Load or unload an adapter; a refusal drops its intent (the status is the truth)."""
        model = self.cfg.model(d.model)
        url = self._control_url(d.worker_id)
        if model is None or url is None:
            return
        try:
            if isinstance(d, LoadAdapter):
                status = await self.control.load_adapter(url, AdapterRequest(
                    model=model.name, uri=model.uri, served_model_name=model.resolved_served_name))
            else:
                status = await self.control.unload_adapter(url, AdapterUnload(model=model.name))
        except ControlError as exc:
            f = self.facts.get(d.worker_id)
            if f is not None:
                self._observe(d.worker_id, f.shape,
                              adapter_intents=tuple(i for i in f.adapter_intents if i.model != d.model))
            log.warning("adapter_call_refused", worker_id=d.worker_id, model=d.model, status=exc.status,
                        error=str(exc))
            return
        self._answered(d.worker_id, status)

    async def _prebuild(self, d: Prebuild) -> None:
        model = self.cfg.model(d.model)
        assert model is not None
        req = PrebuildRequest(model=model.name, uri=model.uri, served_model_name=model.resolved_served_name,
                              max_model_len=model.max_context_tokens, engine=model.engine,
                              engine_class=d.engine_class)
        await self._call(d.worker_id, "prebuild", lambda url: self.control.prebuild(url, req))

    async def _sleep(self, d: Sleep) -> None:
        url = self._control_url(d.worker_id)
        f = self.facts.get(d.worker_id)
        if url is None or f is None:
            return
        try:
            status = await self.control.sleep(url, SleepRequest(assignment_id=f.intent.assignment_id if f.intent else None))
        except ControlError as exc:
            # E.g. an engine started without sleep mode: release it rather than ask again.
            self._control_failed(d.worker_id, "sleep", exc)
            self._observe(d.worker_id, f.shape, intent=Intent("release", self.clock(), d.model,
                                                              f.intent.assignment_id if f.intent else None))
            await self._release(d.worker_id)
            return
        self._answered(d.worker_id, status)

    async def _release(self, worker_id: str) -> None:
        url = self._control_url(worker_id)
        if url is None:
            return
        try:
            status = await self.control.release(url, ReleaseRequest(assignment_id=None, drain_timeout_s=30.0))
        except ControlError as exc:
            self._control_failed(worker_id, "release", exc)
            return
        self._answered(worker_id, status)

    async def _stop_or_start(self, d: Stop | Start) -> None:
        f = self.facts.get(d.worker_id)
        provider = self.providers.get(f.shape) if f else None
        if f is None or f.instance is None or provider is None:
            return
        try:
            if isinstance(d, Stop):
                await provider.stop(f.instance.instance_id)
            else:
                await provider.start(f.instance.instance_id)
                # It boots again: its last heartbeat is from before the stop.
                self._observe(d.worker_id, f.shape, status=None, heard_at=None, restarted_at=self.clock())
        except Exception as exc:
            log.warning("stop_or_start_failed", worker_id=d.worker_id, kind=type(d).__name__, error=str(exc))
            self._observe(d.worker_id, f.shape, intent=None)
            return
        self._refreshed_at = 0.0  # ask the provider again on the next turn

    async def _terminate(self, f: WorkerFacts) -> None:
        provider = self.providers.get(f.shape)
        try:
            if f.instance is not None and provider is not None:
                await provider.terminate(f.instance.instance_id)
            elif f.status is not None:
                # A worker that registered itself: nobody to terminate it, so release it.
                with contextlib.suppress(ControlError):
                    await self.control.release(f.status.control_url, ReleaseRequest())
        finally:
            self.gone.discard(f.worker_id)

    # -- outputs --------------------------------------------------------------------
    def _export(self, now: float, views: dict[str, WorkerView]) -> None:
        counts: dict[tuple[str, str], int] = {}
        for v in views.values():
            if v.host is not None:
                continue  # a packed engine is no worker of its own: its worker counts
            counts[(v.shape, v.state.value)] = counts.get((v.shape, v.state.value), 0) + 1
        self.metrics.workers.clear()
        for (shape, st), n in counts.items():
            self.metrics.workers.labels(shape, st).set(n)
        mx = self.metrics
        for m in self.cfg.models:
            ms = self.state.models.get(m.name)
            mx.backoff.labels(m.name).set(max((ms.backoff_until - now) if ms else 0.0, 0.0))
            r = ms.last_scale if ms else None
            if r is not None:
                for stage, n in (("raw", r.raw), ("bounded", r.bounded), ("target", r.target)):
                    mx.desired.labels(m.name, stage).set(n)
                mx.demand.labels(m.name, "stable").set(r.metrics.stable_demand)
                mx.demand.labels(m.name, "panic").set(r.metrics.panic_demand)
                mx.arrival_rate.labels(m.name).set(r.metrics.arrivals_per_s)
                mx.ttft_p90.labels(m.name).set(r.metrics.ttft_p90_s if r.metrics.ttft_p90_s is not None else 0.0)
                mx.panic.labels(m.name).set(1 if r.panic else 0)
            w = ms.keep_alive if ms else None
            if w is not None:
                mx.keep_alive.labels(m.name, "prewarm").set(-1 if w.prewarm_after_s is None else w.prewarm_after_s)
                mx.keep_alive.labels(m.name, "keep_until").set(w.keep_until_s)
                mx.keep_alive_mode.labels(m.name).set(1 if w.mode == "histogram" else 0)
        for p in self.cfg.pools:
            b = self.shape_backoff.get(p.shape)
            self.metrics.launch_backoff.labels(p.shape).set(max(b.until - now, 0.0) if b else 0.0)
            ps = self.state.pools.get(p.shape)
            if ps is not None and ps.target is not None:
                t = ps.target
                for name, value in (("target", t.target), ("raw", t.raw), ("lower_watermark", t.lower_watermark),
                                    ("upper_watermark", t.upper_watermark),
                                    ("granted", ps.grant.standby if ps.grant else t.target)):
                    mx.standby_target.labels(p.shape, name).set(value)
            if ps is not None and ps.grant is not None:
                mx.shortfall.labels(p.shape).set(ps.grant.shortfall)
                mx.spend.labels(p.shape).set(ps.grant.spend_usd_per_hour)

    def route_table(self, now: float, views: dict[str, WorkerView] | None = None) -> dict[str, ModelRoute]:
        """Ready replicas per model; ``views`` when the caller derived them already."""
        views = self.views(now) if views is None else views
        models: dict[str, ModelRoute] = {}
        for m in self.cfg.models:
            ready, loading = [], 0
            for wid, v in views.items():
                st = self.facts[wid].status
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
                    ready.append(ReplicaRoute(worker_id=wid, url=st.engine_url,
                                              served_model_name=st.served_model_name or m.resolved_served_name,
                                              assignment_id=v.assignment_id, phases=st.phases, load=st.load,
                                              worker_started_at=st.started_at, packed=v.host is not None))
                elif v.state is WorkerState.LOADING:
                    loading += 1
            ms = self.state.models.get(m.name)
            in_backoff = ms is not None and ms.backoff_until > now
            models[m.name] = ModelRoute(
                served_name=m.resolved_served_name, replicas=sorted(ready, key=lambda r: r.worker_id),
                loading=loading, failures=ms.failures if ms else 0,
                error=ms.last_error if ms and ms.failures else None,
                backoff_until=ms.backoff_until if ms and in_backoff else None,
            )
        return models

    def activators(self, now: float) -> int:
        """Activators that reported lately (at least 1: the one asking)."""
        return max(1, sum(1 for r in self.reports.values() if now - r.at <= REPORT_TTL_S))

    async def _publish_routes(self) -> None:
        now = self.clock()
        table = RouteTable(epoch=self.epoch, version=self.routes.version, models=self.route_table(now),
                           activators=self.activators(now), keys_version=self.keys_version)

        # Only the parts activators act on decide whether the version moves.
        def key(t: RouteTable) -> Any:
            return ({n: (tuple(r.url for r in v.replicas), v.loading, v.failures, v.error,
                         v.backoff_until is not None) for n, v in t.models.items()}, t.activators, t.keys_version)

        if key(table) != key(self.routes) or self.routes.version == 0:
            async with self._routes_changed:
                self.routes = table.model_copy(update={"version": self.routes.version + 1})
                self._routes_changed.notify_all()
        else:
            self.routes = table

    async def wait_routes(self, since: int, epoch: str | None, timeout_s: float) -> RouteTable | None:
        """The route table once its version is past ``since`` (at once for a watcher of
        another epoch), or after ``timeout_s``; None before the fleet is adopted."""
        def ready() -> bool:
            return self._closing or (self.routes.version > 0 and (epoch != self.epoch or self.routes.version > since))

        async with self._routes_changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._routes_changed.wait_for(ready), timeout_s)
        return self.routes if self.routes.version > 0 else None

    def status(self) -> PoolStatus:
        now = self.clock()
        act = self.activity(now)
        views = self.views(now)
        routes = self.route_table(now, views)
        shapes = []
        for p in self.cfg.pools:
            shape = self.cfg.shape(p.shape)
            # Instances: a packed engine is part of its worker's (counted and billed once).
            mine = [v for v in views.values() if v.shape == p.shape and v.host is None]
            billed = [v for v in mine if v.state not in (WorkerState.STOPPED, WorkerState.UNREACHABLE)]
            b = self.shape_backoff.get(p.shape)
            provider = self.providers.get(p.shape)
            pstatus = getattr(provider, "status", None)
            ps = self.state.pools.get(p.shape)
            shapes.append(ShapeRow(
                shape=p.shape, provider=p.provider, counts=_count(v.state for v in mine),
                standby_min=p.standby_min, standby_max=p.standby_max, max_instances=p.max_instances,
                budget_usd_per_hour=p.budget_usd_per_hour,
                spend_usd_per_hour=round(len(billed) * (shape.price_per_hour_usd if shape else 0.0), 4),
                backoff_until=b.until if b and b.until > now else None,
                backoff_reason=b.reason if b and b.until > now else None,
                provider_status=(pstatus().get(p.shape, {}) if callable(pstatus) else {}),
                standby_target=ps.target.target if ps and ps.target else None,
                standby_granted=ps.grant.standby if ps and ps.grant else None,
                budget_shortfall=ps.grant.shortfall if ps and ps.grant else 0,
            ))
        models = []
        for m in self.cfg.models:
            a = act.get(m.name, ModelActivity())
            r = routes[m.name]
            models.append(ModelRow(
                name=m.name, served_name=m.resolved_served_name,
                replicas=_count(v.adapter(m.name) for v in views.values() if v.model == m.base and v.adapter(m.name))
                if m.base is not None else _count(v.state for v in views.values() if v.model == m.name),
                queued=a.queued, in_flight=a.in_flight, last_request_at=a.last_request_at,
                error=r.error, backoff_until=r.backoff_until, last_cold_start=self.cold_starts.get(m.name),
            ))
        workers, details = [], []
        for wid in sorted(views):
            v, f = views[wid], self.facts[wid]
            born = f.instance.launched_at if f.instance else (f.launch_requested_at or
                                                              (f.status.started_at if f.status else now))
            workers.append(WorkerRow(id=wid, instance_id=f.instance.instance_id if f.instance else
                                     (f.status.instance_id if f.status else None),
                                     control_url=self._control_url(wid), state=v.state, model=v.model,
                                     age_s=round(max(now - born, 0.0), 1)))
            details.append(WorkerDetail(
                id=wid, shape=v.shape, assignment_id=v.assignment_id,
                engine_url=f.status.engine_url if f.status else None, error=v.error,
                last_heartbeat_s_ago=round(now - f.heard_at, 1) if f.heard_at else None,
                provider_state=f.instance.state.value if f.instance else None,
                load=f.status.load if f.status else None, cached=list(v.cached),
                prebuilt=f.status.prebuilt if f.status else None,
                host_worker_id=v.host, memory_bytes=v.memory_bytes or None, capacity_bytes=v.capacity_bytes or None,
                adapters=list(f.status.adapters) if f.status else [],
            ))
        return PoolStatus(now=now, controller_epoch=self.epoch, adopted=self.adopted, shapes=shapes,
                          models=models, workers=workers, worker_details=details)


def _count(states: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in states:
        key = s.value if isinstance(s, WorkerState) else str(s)
        out[key] = out.get(key, 0) + 1
    return out
