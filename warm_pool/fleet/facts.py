"""What the controller knows of its fleet: facts, recorded in one place, and each
worker's view derived from them.

It records what it learns of each worker (:class:`~warm_pool.fleet.view.WorkerFacts`): what
the providers say of its instance, its heartbeats and its answers to control calls, the
control call just made to it (an intent it has not reflected yet). Nothing here sets a
worker's state: :meth:`FleetFacts.views` derives it (``warm_pool.fleet.view.derive_view``).

A packed engine (one of several engines in one worker) reports under its own id, with
the worker that runs it as its host; it is known here only while that worker is, and
forgotten when the worker stops listing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.wire import HeartbeatReply, WorkerStatus
from warm_pool.fleet.view import INTENT_TTL_S, WorkerFacts, derive_view, view_valid_until
from warm_pool.metrics import PoolMetrics
from warm_pool.policy.decide import WorkerView
from warm_pool.providers.provider import InstanceState

log = get_logger()

# A worker that refused a packed engine takes none for this long (its accounting and
# the controller's disagree until its next heartbeats settle it).
PACK_REFUSED_S = 30.0
# Packed engines gone whose ids are remembered, to refuse their late heartbeats.
RELEASED_ENGINES_KEPT = 10_000


class UnknownInstance(Exception):
    """A heartbeat from an instance that no provider of this cluster launched (403)."""


def is_older(status: WorkerStatus, held: WorkerStatus | None) -> bool:
    """Whether ``status`` was given before ``held`` by the same start of the same worker
    (``WorkerStatus.seq``; 0, an uncounted status, is never older)."""
    return (held is not None and status.seq > 0 and held.seq > status.seq
            and status.instance_id == held.instance_id and status.started_at == held.started_at)


class FleetFacts:
    """One :class:`WorkerFacts` per worker (``facts``), changed only through
    :meth:`observe` and :meth:`forget`, and the sets that keep workers gone."""

    def __init__(self, *, config: Callable[[], ThawConfig], clock: Callable[[], float], epoch: str,
                 metrics: PoolMetrics, wake: Callable[[], None]) -> None:
        """``config``: the config in force (budgets change at run time); ``wake``: asks
        the loop to decide now (a worker's state changed)."""
        self._config = config
        self.clock = clock
        self.epoch = epoch
        self.metrics = metrics
        self._wake = wake
        self.facts: dict[str, WorkerFacts] = {}
        # Workers being terminated: their last heartbeats must not bring them back.
        self.gone: set[str] = set()
        # Packed engines that went away (their ids are never reused): the same.
        # Ids of packed engines gone (never reused), the oldest dropped beyond
        # RELEASED_ENGINES_KEPT: a late heartbeat comes seconds after, not hours.
        self.released_engines: dict[str, None] = {}
        # Workers with a control call in flight: not forgotten while it lasts.
        self.busy: set[str] = set()
        # Workers that refused a packed engine, and when.
        self._pack_refused: dict[str, float] = {}
        # Each worker's last view: its facts, boot and heartbeat timeouts, until when it holds.
        self._derived: dict[str, tuple[WorkerFacts, float, float, float, WorkerView]] = {}
        # Each host's packed engines known here (kept by observe and forget): a heartbeat
        # prunes its host's, not a scan of the fleet (a thousand workers' heartbeats each
        # scanning a thousand facts was a few percent of the controller in a burst).
        self._hosted: dict[str, set[str]] = {}

    # -- facts (the one place they change) -----------------------------------------
    def observe(self, worker_id: str, shape: str, **changes: Any) -> WorkerFacts:
        cur = self.facts.get(worker_id) or WorkerFacts(worker_id, shape)
        new = replace(cur, **changes)
        self.facts[worker_id] = new
        if new.host is not None:
            self._hosted.setdefault(new.host, set()).add(worker_id)
        return new

    def forget(self, worker_id: str) -> None:
        f = self.facts.pop(worker_id, None)
        if f is not None and f.host is not None and (engines := self._hosted.get(f.host)) is not None:
            engines.discard(worker_id)
            if not engines:
                del self._hosted[f.host]

    def engines_of(self, host_id: str) -> list[str]:
        """The packed engines known to run on ``host_id``."""
        return sorted(self._hosted.get(host_id, ()))

    def engine_gone(self, worker_id: str) -> None:
        """A packed engine went away: forgotten, and its late heartbeats refused."""
        self.forget(worker_id)
        self.released_engines[worker_id] = None
        while len(self.released_engines) > RELEASED_ENGINES_KEPT:
            del self.released_engines[next(iter(self.released_engines))]

    def unreported(self) -> list[str]:
        """Workers whose instances run and that have not reported to this controller yet
        (one serving under load may take a few seconds to, after a restart)."""
        return sorted(wid for wid, f in self.facts.items()
                      if f.host is None and f.heard_at is None and f.instance is not None
                      and f.instance.state is InstanceState.RUNNING)

    def terminating(self, worker_id: str) -> WorkerFacts | None:
        """A worker is being terminated: forgotten with its packed engines, and its late
        heartbeats refused until :meth:`terminated`. Returns its last facts."""
        last = self.facts.get(worker_id)
        self.forget(worker_id)
        for wid in self.engines_of(worker_id):  # its packed engines go with its instance
            self.engine_gone(wid)
        self.gone.add(worker_id)
        return last

    def terminated(self, worker_id: str) -> None:
        self.gone.discard(worker_id)

    def pack_refused(self, worker_id: str) -> None:
        """A worker refused a packed engine: it is offered none for PACK_REFUSED_S."""
        self._pack_refused[worker_id] = self.clock()

    def answered(self, worker_id: str, status: WorkerStatus) -> None:
        """A worker's answer to a control call: its status, as a heartbeat's."""
        f = self.facts.get(worker_id)
        if f is not None and worker_id not in self.gone and not is_older(status, f.status):
            self.observe(worker_id, f.shape, status=status, heard_at=self.clock())

    def control_url(self, worker_id: str) -> str | None:
        """Where the worker takes control calls (a packed engine: under its worker's)."""
        f = self.facts.get(worker_id)
        if f is None:
            return None
        if f.status is not None:
            return f.status.control_url
        if f.host is not None:
            host = self.control_url(f.host)
            return None if host is None else f"{host.rstrip('/')}/engines/{worker_id}"
        return f.instance.control_url if f.instance is not None else None

    # -- heartbeats -----------------------------------------------------------------
    def heartbeat(self, status: WorkerStatus) -> HeartbeatReply:
        """A worker's heartbeat. Raises :class:`UnknownInstance` for an instance no
        provider here launched (a worker on a local pool may register itself)."""
        now = self.clock()
        cfg = self._config()
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
            pool = cfg.pool(status.shape)
            if pool is None or pool.provider not in ("local", "static"):
                self.metrics.heartbeats.labels("refused").inc()
                raise UnknownInstance(
                    f"instance {status.instance_id!r} (worker {status.worker_id!r}) was not launched by this "
                    f"cluster's providers")
            log.info("worker_registered", worker_id=status.worker_id, instance_id=status.instance_id,
                     shape=status.shape, control_url=status.control_url)
        prev = f.status if f is not None else None
        if is_older(status, prev):
            # Sent before the status held (the answer to a control call came first): a
            # sign of life, not news; taken, it would undo the assignment just answered
            # and the worker would be assigned again.
            self.observe(status.worker_id, status.shape, heard_at=now)
            self.metrics.heartbeats.labels("stale").inc()
            return HeartbeatReply(controller_epoch=self.epoch, interval_s=cfg.cluster.heartbeat_interval_s)
        self.observe(status.worker_id, status.shape, status=status, heard_at=now)
        self._prune_engines(status.worker_id, status, now)
        self.metrics.heartbeats.labels("accepted").inc()
        if prev is None or prev.state != status.state or prev.engine_url != status.engine_url \
                or prev.adapters != status.adapters:
            self._wake()
        return HeartbeatReply(controller_epoch=self.epoch, interval_s=cfg.cluster.heartbeat_interval_s)

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
        if prev is not None and is_older(status, prev.status):
            self.observe(status.worker_id, status.shape, heard_at=now, host=host_id)
            self.metrics.heartbeats.labels("stale").inc()
            return HeartbeatReply(controller_epoch=self.epoch, interval_s=self._config().cluster.heartbeat_interval_s)
        self.observe(status.worker_id, status.shape, status=status, heard_at=now, host=host_id)
        self.metrics.heartbeats.labels("accepted").inc()
        if prev is None or prev.status is None or prev.status.state != status.state \
                or prev.status.engine_url != status.engine_url or prev.status.adapters != status.adapters:
            self._wake()
        return HeartbeatReply(controller_epoch=self.epoch, interval_s=self._config().cluster.heartbeat_interval_s)

    def _prune_engines(self, host_id: str, status: WorkerStatus, now: float) -> None:
        """Forget the packed engines a worker no longer lists (released and gone), but
        not one just asked for, which it may not have listed yet."""
        listed = set(status.engines)
        for wid in self.engines_of(host_id):
            if wid in listed or wid in self.busy:
                continue
            i = self.facts[wid].intent
            if i is not None and i.kind == "assign" and now - i.at < INTENT_TTL_S:
                continue
            log.info("packed_engine_gone", worker_id=wid, host=host_id)
            self.engine_gone(wid)
            self._wake()

    # -- the derived view -----------------------------------------------------------
    def views(self, now: float) -> dict[str, WorkerView]:
        """Each worker's view at ``now``, derived from its facts."""
        cfg = self._config()
        timeout = cfg.cluster.worker_timeout_s
        heard = [f.heard_at for f in self.facts.values() if f.heard_at is not None]
        if heard and now - max(heard) > timeout:
            # Not one worker heard from in that time: more likely this controller is cut
            # off (or was stalled) than every worker dead. Silence proves nothing now; the
            # providers still report exits and stops.
            timeout = float("inf")
        out = {}
        derived: dict[str, tuple[WorkerFacts, float, float, float, WorkerView]] = {}
        shapes = {s.name: s for s in cfg.shapes}
        for wid, f in self.facts.items():
            shape = shapes.get(f.shape)
            boot = shape.boot_timeout_s if shape else 600.0
            # The last view, while its facts are the same object and no time its rules
            # compare with has come (with 1,000 workers, deriving every view each turn
            # was a third of an idle turn; a heartbeat replaces a worker's facts).
            last = self._derived.get(wid)
            if last is not None and last[0] is f and last[1] == boot and last[2] == timeout and now < last[3]:
                derived[wid] = last
                v = last[4]
            else:
                v = derive_view(f, now, boot_timeout_s=boot, worker_timeout_s=timeout)
                derived[wid] = (f, boot, timeout, view_valid_until(f, v, now, boot_timeout_s=boot, worker_timeout_s=timeout),
                                v)
            if v.capacity_bytes and now - self._pack_refused.get(wid, -PACK_REFUSED_S) < PACK_REFUSED_S:
                v = replace(v, capacity_bytes=0)
            out[wid] = v
        self._derived = derived
        return out
