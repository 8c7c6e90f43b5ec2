"""The providers' side of carrying out decisions: launch, stop, start and terminate
instances (``warm_pool.providers``), each fenced (``warm_pool.fencing``): its action is
written under the leader's term before the provider is called, and a refusal means no
call. A shape whose launches fail is backed off, doubling per failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.wire import ReleaseRequest
from warm_pool.db import StateUnavailable
from warm_pool.events import EventLog
from warm_pool.fencing import ActionLog, Deposed
from warm_pool.fleet.control import ControlError, WorkerControl
from warm_pool.fleet.facts import FleetFacts
from warm_pool.fleet.view import WorkerFacts
from warm_pool.metrics import PoolMetrics
from warm_pool.policy.decide import launch_backoff_s
from warm_pool.policy.decisions import Start, Stop
from warm_pool.providers.provider import CapacityError, Provider

log = get_logger()

# Launch failures other than capacity (API errors) pause a shape this long, doubling.
LAUNCH_ERROR_BACKOFF_S = (5.0, 120.0)


@dataclass(frozen=True)
class ShapeBackoff:
    """A shape whose launches failed ``failures`` times in a row: none before ``until``."""

    failures: int
    until: float
    reason: str


class Machines:
    """Provider calls for the actuator (``warm_pool.fleet.actuator``), under its term."""

    def __init__(self, *, fleet: FleetFacts, providers: dict[str, Provider], control: WorkerControl,
                 config: Callable[[], ThawConfig], clock: Callable[[], float], events: EventLog,
                 metrics: PoolMetrics, refresh_soon: Callable[[], None], actions: ActionLog | None) -> None:
        self.fleet = fleet
        self.providers = providers
        self.control = control
        self._config = config
        self.clock = clock
        self.events = events
        self.metrics = metrics
        self._refresh_soon = refresh_soon
        self.actions = actions
        self.term: int | None = None
        self.shape_backoff: dict[str, ShapeBackoff] = {}

    async def launch(self, worker_id: str, shape: str) -> None:
        provider = self.providers.get(shape)
        if provider is None:
            self.fleet.forget(worker_id)
            log.error("no_provider", shape=shape)
            return
        action = await self._begin("launch", worker_id=worker_id, shape=shape)
        if action is None:
            self.fleet.forget(worker_id)
            return
        try:
            inst = await provider.launch(shape, worker_id, term=self.term)
        except CapacityError as exc:
            self.fleet.forget(worker_id)
            self._launch_failed(shape, "capacity", str(exc), worker_id)
            await self._end(action, f"failed: capacity: {exc}")
            return
        except Exception as exc:
            self.fleet.forget(worker_id)
            self._launch_failed(shape, "error", f"{type(exc).__name__}: {exc}", worker_id)
            await self._end(action, f"failed: {type(exc).__name__}: {exc}")
            return
        await self._end(action, "done", inst.instance_id)
        self.shape_backoff.pop(shape, None)
        self.fleet.observe(worker_id, shape, instance=inst, launch_requested_at=None)
        self.events.record("launched", "provider", worker_id=worker_id, shape=shape, outcome="done",
                           inputs={"instance_id": inst.instance_id, **dict(inst.detail)})

    async def _begin(self, kind: str, *, worker_id: str, shape: str, instance_id: str | None = None) -> str | None:
        """Write a provider action under this actuator's term before its call: the
        action's id ("" when actions are not written), or None when it was refused (this
        term is over, or the state database is away): then no call is made."""
        if self.actions is None:
            return ""
        try:
            return await asyncio.to_thread(self.actions.begin, self.term, kind, worker_id=worker_id,
                                           instance_id=instance_id, shape=shape)
        except StateUnavailable as exc:
            deposed = isinstance(exc, Deposed)
            self.metrics.fenced.labels(kind, "deposed" if deposed else "state_unavailable").inc()
            log.warning("provider_action_refused", kind=kind, worker_id=worker_id, term=self.term,
                        deposed=deposed, error=str(exc))
            return None

    async def _end(self, action: str, outcome: str, instance_id: str | None = None) -> None:
        """How a provider action ended (kept as history; a database away loses only this)."""
        if self.actions is None or not action:
            return
        with contextlib.suppress(StateUnavailable):
            await asyncio.to_thread(self.actions.end, action, outcome, instance_id)

    def _launch_failed(self, shape: str, cause: str, message: str, worker_id: str) -> None:
        prev = self.shape_backoff.get(shape)
        failures = (prev.failures if prev else 0) + 1
        pool = self._config().pool(shape)
        if cause == "capacity" and pool is not None and pool.ec2 is not None:
            base, cap = pool.ec2.backoff_base_s, pool.ec2.backoff_max_s
        else:
            base, cap = LAUNCH_ERROR_BACKOFF_S
        pause = launch_backoff_s(failures, base, cap)
        self.shape_backoff[shape] = ShapeBackoff(failures, self.clock() + pause, message)
        self.metrics.launch_failures.labels(shape, cause).inc()
        log.warning("launch_failed", shape=shape, cause=cause, error=message, failures=failures, backoff_s=pause)
        self.events.record("launch", cause, worker_id=worker_id, shape=shape, outcome="failed",
                           inputs={"error": message, "failures": failures, "backoff_s": pause})

    async def stop_or_start(self, d: Stop | Start) -> None:
        f = self.fleet.facts.get(d.worker_id)
        provider = self.providers.get(f.shape) if f else None
        if f is None or f.instance is None or provider is None:
            return
        action = await self._begin(type(d).__name__.lower(), worker_id=d.worker_id, shape=f.shape,
                                   instance_id=f.instance.instance_id)
        if action is None:
            self.fleet.observe(d.worker_id, f.shape, intent=None)
            return
        try:
            if isinstance(d, Stop):
                await provider.stop(f.instance.instance_id)
            else:
                await provider.start(f.instance.instance_id)
                # It boots again: its last heartbeat is from before the stop.
                self.fleet.observe(d.worker_id, f.shape, status=None, heard_at=None, restarted_at=self.clock())
        except Exception as exc:
            log.warning("stop_or_start_failed", worker_id=d.worker_id, kind=type(d).__name__, error=str(exc))
            self.fleet.observe(d.worker_id, f.shape, intent=None)
            await self._end(action, f"failed: {type(exc).__name__}: {exc}")
            return
        await self._end(action, "done")
        self._refresh_soon()

    async def terminate(self, f: WorkerFacts) -> None:
        provider = self.providers.get(f.shape)
        try:
            if f.instance is not None and provider is not None:
                action = await self._begin("terminate", worker_id=f.worker_id, shape=f.shape,
                                           instance_id=f.instance.instance_id)
                if action is None:
                    return  # forgotten here; the instance is listed again on the next refresh
                try:
                    await provider.terminate(f.instance.instance_id)
                except Exception as exc:
                    await self._end(action, f"failed: {type(exc).__name__}: {exc}")
                    raise
                await self._end(action, "done")
            elif f.status is not None:
                # A worker that registered itself: nobody to terminate it, so release it.
                with contextlib.suppress(ControlError):
                    await self.control.release(f.status.control_url, ReleaseRequest())
        finally:
            self.fleet.terminated(f.worker_id)

