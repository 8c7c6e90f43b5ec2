"""The controller's object graph, built once: ``build_pool`` makes its parts
(``PoolParts``: the state database's stores, the registry and the operators' admins,
the batch runner, the event log, the lease) and the manager whose loop runs them.

The API (``warm_pool.api``) calls the parts directly; the manager is the control loop.
The parts call back into the loop (a changed registry or key table publishes routes,
gaining or losing the lease starts or stops it), and are built before it: those calls
go through ``LoopCalls``, bound to the manager once it exists.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from thaw.batch_lines import tenant_models
from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.telemetry import tracing_from
from warm_pool.batch.files import FileIndex
from warm_pool.batch.runner import BatchRunner
from warm_pool.batch.store import BatchStore
from warm_pool.classes import ModelClasses
from warm_pool.clock import ClockAdmin
from warm_pool.conversations.store import ResponseStore
from warm_pool.db import Db
from warm_pool.events import EventLog
from warm_pool.fencing import ActionLog, LeaseFence
from warm_pool.fleet.control import WorkerControl
from warm_pool.fleet.start_traces import StartTraces
from warm_pool.leader import Leadership, LeaseStore
from warm_pool.manager import PoolManager
from warm_pool.metrics import PoolMetrics
from warm_pool.persist import ControllerStore
from warm_pool.providers.provider import Provider
from warm_pool.registry.admin import BudgetAdmin, KeyAdmin
from warm_pool.registry.apply import Applier
from warm_pool.registry.models import ModelRegistry, StoreReader
from warm_pool.registry.store import REGISTRY_FILE, RegistryStore
from warm_pool.registry.tenants import TenantAdmin

log = get_logger()


@dataclass(frozen=True)
class PoolParts:
    """What the controller is made of, for as long as it runs (what it learns of the
    fleet anew with each term of leading is the manager's: ``PoolManager.fleet``...)."""

    providers: dict[str, Provider]  # each pool's shape to the provider that runs it
    control: WorkerControl
    clock: Callable[[], float]
    model_classes: ModelClasses | None
    controller_id: str
    url: str  # where the other controllers and clients reach this one
    registry: CollectorRegistry
    metrics: PoolMetrics
    wake: asyncio.Event  # set: the loop takes its next turn now
    store: ControllerStore
    files: FileIndex
    batches: BatchStore
    responses: ResponseStore
    batch_runner: BatchRunner
    event_log: EventLog
    model_admin: ModelRegistry
    budgets: BudgetAdmin
    clock_admin: ClockAdmin
    key_admin: KeyAdmin
    tenant_admin: TenantAdmin
    applier: Applier
    leadership: Leadership | None  # None: this one always leads
    actions: ActionLog  # the provider actions, each written under its term first
    start_traces: StartTraces  # traced requests waiting for a model: its start joins their trace


class LoopCalls:
    """The parts' calls into the manager's loop, which is built after them."""

    manager: PoolManager | None = None

    def _loop(self) -> PoolManager:
        assert self.manager is not None, "the parts called the loop before it was built"
        return self.manager

    async def models_changed(self, cfg: ThawConfig) -> None:
        await self._loop().models_changed(cfg)

    async def keys_changed(self) -> None:
        await self._loop().keys_changed()

    async def lead(self, term: int) -> None:
        await self._loop().lead(term)

    async def follow(self) -> None:
        await self._loop().follow()


def build_pool(
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
) -> PoolManager:
    """The controller: its parts (``manager.parts``) and the manager that runs them.

    ``providers`` maps each pool's shape to the provider that runs it.
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
    loop = LoopCalls()
    parts = build_parts(cfg, providers, control, loop, registry=registry, clock=clock, state_dir=state_dir,
                        model_classes=model_classes, store_reader=store_reader, store_client=store_client,
                        state_db=state_db, lease=lease, controller_id=controller_id or uuid.uuid4().hex[:12],
                        url=url, lease_s=lease_s)
    loop.manager = PoolManager(parts, poll_interval_s=poll_interval_s, refresh_interval_s=refresh_interval_s,
                               epoch=epoch or uuid.uuid4().hex[:8],
                               # One heartbeat interval and a margin: long enough for every live
                               # worker to report.
                               adopt_grace_s=(cfg.cluster.heartbeat_interval_s * 1.5 + 0.5)
                               if adopt_grace_s is None else adopt_grace_s)
    manager = loop.manager
    # The term each call was decided in (the actuator's: a deposed controller's call in
    # flight carries its old term, which a worker that heard of the new one refuses), and
    # when its lease ends by its own count (a call arriving later is refused anyway).
    leadership = parts.leadership
    control.fence(lambda: manager.actuator.term, None if leadership is None else leadership.lease_until)
    return loop.manager


def build_parts(cfg: ThawConfig, providers: dict[str, Provider], control: WorkerControl, loop: LoopCalls, *,
                registry: CollectorRegistry | None, clock: Callable[[], float], state_dir: Path | None,
                model_classes: ModelClasses | None, store_reader: StoreReader | None,
                store_client: Callable[[], Any] | None, state_db: Db | None, lease: LeaseStore | None,
                controller_id: str, url: str, lease_s: float | None) -> PoolParts:
    """The parts (``build_pool`` says what each argument is)."""
    registry = registry or CollectorRegistry()
    metrics = PoolMetrics(registry)
    wake = asyncio.Event()
    # The config in force (``budgets.cfg``): the config as written serving the registry's
    # models, with the operators' budget changes (both in the state database, so a
    # restart or another controller keeps them).
    db = state_db or Db.sqlite(state_dir / REGISTRY_FILE if state_dir else None)
    store = ControllerStore(db, state_dir)
    files, batches, responses = FileIndex(db), BatchStore(db), ResponseStore(db)
    event_log = EventLog(clock, controller=controller_id)
    model_admin = ModelRegistry(cfg, RegistryStore(db), store_reader, event_log, on_change=loop.models_changed,
                                clock=clock)
    budgets = BudgetAdmin(model_admin.cfg, store, event_log, wake.set)
    key_admin = KeyAdmin(cfg, state_dir, event_log, loop.keys_changed,
                         tenants=lambda: model_admin.base.tenants, db=state_db)

    async def tenant_removed(tenant: str, who: str) -> int:
        """A tenant was removed: its keys revoked (how many), its stored responses deleted."""
        revoked = await key_admin.revoke_tenant(tenant, who)
        deleted = await asyncio.to_thread(responses.delete_tenant, tenant)
        log.info("tenant_responses_deleted", tenant=tenant, responses=deleted)
        return revoked

    tenant_admin = TenantAdmin(model_admin, event_log, clock=clock, on_removed=tenant_removed)
    # Several controllers on one database: this one leads while it holds the lease.
    leadership = None if lease is None else Leadership(
        lease, controller_id, url, lease_s or cfg.cluster.heartbeat_interval_s * 1.5,
        on_lead=loop.lead, on_follow=loop.follow)
    # Fenced (warm_pool.fencing): every change to the shared database, and every provider
    # action, only while this controller holds the lease in the term it acts in.
    fence = None if leadership is None else LeaseFence(
        controller_id, lambda: leadership.term if leadership.leading else None)
    if fence is not None:
        db.fence = fence.check
    batch_runner = BatchRunner(
        batches, files, store_client, cfg.object_store.bucket, cfg.batch.files_prefix,
        resolver=lambda tenant: tenant_models(model_admin.cfg, tenant), clock=clock,
        leading=lambda: leadership is None or leadership.leading, metrics=metrics)
    batch_runner.on_demand = wake.set
    return PoolParts(
        providers=providers, control=control, clock=clock, model_classes=model_classes,
        controller_id=controller_id, url=url, registry=registry, metrics=metrics, wake=wake, store=store,
        files=files, batches=batches, responses=responses, batch_runner=batch_runner, event_log=event_log,
        model_admin=model_admin, budgets=budgets, clock_admin=ClockAdmin(clock, event_log, lambda: budgets.cfg,
                                                                         wake.set),
        key_admin=key_admin, tenant_admin=tenant_admin,
        applier=Applier(model_admin, tenant_admin, event_log, clock=clock), leadership=leadership,
        actions=ActionLog(db, controller_id, fence),
        start_traces=StartTraces(tracing_from(cfg.telemetry, "thaw-controller"), clock))
