"""A request's way to a replica of its model, at this activator.

A request for a model with a usable replica with a free slot gets one at once (prefix
affinity with bounded load). With none usable it waits in the model's cold queue —
bounded, FIFO, with a deadline — while the controller is told of the demand; when
replicas appear the waiters are released in arrival order, and when the model's load
fails they all get the reason at once. With every replica full it waits in the model's
fair queue, handed freed slots round-robin across tenants.

``Router`` ties the parts together and is the only writer of their state: the feed
(``activator.routing.feed``) brings it route tables; each model's replicas
(``activator.routing.replicas``), its cold and fair queues (``activator.routing.queues``)
and its traffic counts (``activator.routing.activity``) hold that state.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from activator.errors import NotFound, ServiceUnavailable, TooManyRequests
from activator.routing.activity import ModelActivity
from activator.routing.feed import ControllerFeed, Followed
from activator.routing.queues import ColdQueue, FairQueue
from activator.routing.replicas import ModelReplicas, ModelState, OnReplica, Replica
from thaw.config import Model
from thaw.wire import ActivityReport, Catalog, ColdStartRecord, KeyTable, ModelRoute, RouteTable

QUEUE_FULL_RETRY_AFTER_S = 2.0
TIMEOUT_RETRY_AFTER_S = 5.0
# A model whose pool is full: the controller frees an instance as soon as a replica of
# another model goes idle, so a retry a few seconds on may find one.
CAPACITY_RETRY_AFTER_S = 5.0

# What a tenant is told when its model's load failed: the kind of failure
# (thaw.wire.FailureKind, from the exception types on the worker), never the operator's
# details (store endpoints, bucket paths, hashes, tracebacks: those are in the
# controller's state, `thaw status` and the logs).
PUBLIC_FAILURES: dict[str | None, str] = {
    "weights_integrity": "its weights do not match their manifest (sha256, size or format)",
    "store": "its weights could not be read from the object store",
    "memory": "it does not fit in the worker's memory",
    "engine": "its engine did not start",
    "capacity": "its pool has no instance free",
}


def public_failure(kind: str | None) -> str:
    """The reason a model failed to start, as its callers may see it."""
    return PUBLIC_FAILURES.get(kind, PUBLIC_FAILURES["engine"])


# How many of a model's last cold starts estimate its next (``expected_cold_start_s``).
COLD_STARTS_KEPT = 5


@dataclass(frozen=True)
class Acquired:
    replica: Replica
    cold: bool
    queue_s: float


@dataclass(frozen=True)
class ModelStatus:
    """One model at this activator, as ``/v1/models`` and ``/metrics`` show it."""

    state: ModelState
    ready: int
    loading: int
    # Requests waiting for a first replica (cold), and for a slot on a full one (fair).
    cold_queue: int
    fair_queue: int
    # The last failure's kind (thaw.wire.FailureKind).
    failure_kind: str | None
    # What a cold start of it takes, request to first token: the median of its last few
    # here (None: none seen by this activator).
    expected_cold_start_s: float | None = None


@dataclass
class _ModelRoutes:
    replicas: ModelReplicas
    cold: ColdQueue = field(default_factory=ColdQueue)
    fair: FairQueue = field(default_factory=FairQueue)
    activity: ModelActivity = field(default_factory=ModelActivity)
    # The last few cold starts' request-to-first-token times here (seconds).
    cold_totals: deque[float] = field(default_factory=lambda: deque(maxlen=COLD_STARTS_KEPT))


def wakes(replicas: ModelReplicas, now: float) -> bool:
    """Whether a request for a model with these replicas should signal demand before it
    is admitted: no usable replica, and no backoff or capacity refusal (its wait says
    those). The model's tokenizer is fetched from the store on its first request
    (seconds: a burst of 1,000 models at zero waited on it before any was signalled); a
    request refused after (too long for the context, over its tenant's limits) has woken
    the model for nothing, and its replica idles out like any other."""
    return not replicas.usable and not replicas.backing_off(now) and not replicas.at_capacity()


class Router:
    def __init__(
        self,
        models: list[Model],
        pool_url: str,
        activator_id: str,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        report_interval_s: float = 1.0,
        on_replica: OnReplica | None = None,
        on_keys: Callable[[KeyTable], Awaitable[None]] | None = None,
        keys_version: int | None = None,
        on_catalog: Callable[[Catalog, Catalog], Awaitable[None]] | None = None,
        catalog: Catalog | None = None,
        ejection_s: float = 10.0,
    ) -> None:
        self.models = {m.name: m for m in models}
        self.ejection_s = ejection_s
        self.clock = clock
        # Told (up, replica id, model, time) when a replica appears or goes: the ledger
        # keeps replica lifetimes for GPU-second attribution.
        self._on_replica = on_replica
        # The tables the route table carries the version of (None known: version 0, the
        # controller's before any change): the API keys (``on_keys``) and the models and
        # tenants in force (``on_catalog``: given the whole catalog and the answer it came
        # from, a delta or itself; ``catalog``: the one held, which deltas merge into).
        followed: dict[str, Followed] = {}
        if on_keys is not None:
            followed["keys"] = Followed("/v1/keys", KeyTable.model_validate_json, on_keys, keys_version or 0)
        if on_catalog is not None:
            followed["catalog"] = Followed("/v1/catalog", Catalog.model_validate_json, on_catalog,
                                           catalog.version if catalog else 0, merge=Catalog.merged, table=catalog)
        self.feed = ControllerFeed(pool_url, activator_id, on_table=self.apply, report=self.report_body,
                                   followed=followed, token=token, report_interval_s=report_interval_s)
        # Kept for a removed model too: its requests in flight still end here.
        self._routes: dict[str, _ModelRoutes] = {m.name: self._new_routes(m.name) for m in models}
        # Set by the batch worker (``yield_batch_with``): cut one of its requests on a
        # model, for an online request that found every slot taken.
        self._yield_batch: Callable[[str], None] | None = None

    def _new_routes(self, model: str) -> _ModelRoutes:
        return _ModelRoutes(ModelReplicas(model, self._on_replica))

    async def start(self) -> None:
        await self.feed.start()

    async def close(self) -> None:
        await self.feed.close()

    def set_models(self, models: list[Model]) -> None:
        """The models in force changed (the catalog): new ones get routes; a removed
        one's waiting requests are told it does not exist, its requests in flight finish."""
        names = {m.name for m in models}
        self.models = {}
        self.change_models(models, [name for name in self._routes if name not in names])

    def change_models(self, changed: list[Model], removed: list[str]) -> None:
        """A delta of the catalog: only the models ``changed`` (added or changed) and
        ``removed`` differ from those held, taken in as :meth:`set_models` takes them (a
        change costs the models it names, not the 10,000 in force)."""
        for m in changed:
            self.models[m.name] = m
        for name in removed:
            self.models.pop(name, None)
        held = self.feed.table.models if self.feed.table is not None else {}
        for m in changed:
            if m.name not in self._routes:
                self._routes[m.name] = self._new_routes(m.name)
                # Its route came before its catalog did (and went nowhere): a delta sends
                # it again only when it changes, so take it from the table held.
                if (entry := held.get(m.name)) is not None:
                    self._take(m.name, entry, self.clock())
        for name in removed:
            if (r := self._routes.get(name)) is not None and name not in self.models:
                gone = NotFound(f"the model {name!r} does not exist", param="model")
                r.cold.fail_all(gone)
                r.fair.fail_all(gone)

    def apply(self, table: RouteTable) -> None:
        """Take in a route table from the controller (a whole one, or a delta: only the
        models it names changed) and wake or fail waiters."""
        self.feed.track(table)
        now = self.clock()
        for name, entry in table.models.items():
            if name in self._routes:
                self._take(name, entry, now)

    def _take(self, name: str, entry: ModelRoute, now: float) -> None:
        """Take in one model's route: wake its waiters, or fail them on a new failure."""
        r = self._routes[name]
        new_failure = r.replicas.take(entry, now)
        if r.replicas.usable:
            self._wake(name)
        elif new_failure:
            served = m.resolved_served_name if (m := self.models.get(name)) else name
            r.cold.fail_all(self._refusal(served, r.replicas, now, "retrying after a backoff"))

    @staticmethod
    def _refusal(served: str, replicas: ModelReplicas, now: float, next_try: str) -> ServiceUnavailable:
        """The 503 for a model its requests cannot wait for, by the kind of its failure:
        its pool has no instance for it (the controller's reason: the pool and its cap),
        or its load failed (the kind alone, never the operator's details; ``next_try``:
        what comes of it)."""
        if replicas.failure_kind == "capacity":
            return ServiceUnavailable(f"model {served!r} cannot start now: {replicas.error}; retry later",
                                      code="pool_at_capacity", retry_after_s=CAPACITY_RETRY_AFTER_S)
        until = replicas.backoff_until
        return ServiceUnavailable(f"model {served!r} failed to start: {public_failure(replicas.failure_kind)}; "
                                  f"{next_try}", retry_after_s=(until - now) if until else TIMEOUT_RETRY_AFTER_S)

    def _wake(self, model: str) -> None:
        """Usable replicas: release the cold queue, hand free slots to the fair queue."""
        r = self._routes[model]
        r.cold.release_all()
        r.fair.dispatch(lambda key: self._reserve(model, key))

    # -- what others read -----------------------------------------------------------------
    def model_names(self) -> list[str]:
        """Every model this activator has routes for (removed ones included)."""
        return list(self._routes)

    def replicas(self, model: str) -> ModelReplicas:
        """``model``'s replicas, to read (the router changes them)."""
        return self._routes[model].replicas

    def status(self, model: str) -> ModelStatus:
        r = self._routes[model]
        return ModelStatus(state=r.replicas.state(self.clock()), ready=len(r.replicas.usable),
                           loading=r.replicas.loading, cold_queue=len(r.cold), fair_queue=len(r.fair),
                           failure_kind=r.replicas.failure_kind,
                           expected_cold_start_s=statistics.median(r.cold_totals) if r.cold_totals else None)

    # -- a request's life, as the service reports it (the only writers of these counts) --
    def arrive(self, model: str, now: float) -> bool:
        """A request for ``model`` arrived: counted; whether it finds no ready replica
        (part of a cold start, answered or not; all replicas busy is not one)."""
        r = self._routes[model]
        r.activity.arrived(now)
        return not r.replicas.usable

    def started(self, model: str) -> None:
        """A request acquired its replica and is being sent."""
        self._routes[model].activity.started()

    def ended(self, model: str, now: float, replica: Replica | None = None) -> None:
        """A started request ended (``replica``: its slot is freed too)."""
        if replica is not None:
            self.release(model, replica)
        self._routes[model].activity.ended(now)

    def note_ttft(self, model: str, seconds: float) -> None:
        """A hot request's time to first byte (the autoscaler's TTFT target)."""
        self._routes[model].activity.note_ttft(seconds)

    # -- slots ----------------------------------------------------------------------------
    def _reserve(self, model: str, key: str | None = None) -> Replica | None:
        """A free slot on a usable replica, taken: prefix affinity with bounded load."""
        m = self.models.get(model)
        if m is None:  # removed since the request was admitted: no new replica for it
            return None
        return self._routes[model].replicas.reserve(m.autoscaling.max_concurrency_per_replica, key)

    async def acquire(self, model: Model, arrival: float, key: str | None = None,
                      tenant: str = "") -> Acquired:
        """A replica slot for ``model`` (reserved: ``release`` frees it).

        No replica: wait in the model's cold queue. Replicas all busy: wait in the
        model's fair queue, served round-robin across tenants.
        """
        cold = not self._routes[model.name].replicas.usable
        if cold:
            await self._wait_cold(model, arrival)
        rep = self._reserve(model.name, key)
        if rep is None:
            rep = await self._wait_fair(model, arrival, key, tenant)
        return Acquired(rep, cold=cold, queue_s=(self.clock() - arrival) if cold else 0.0)

    def release(self, model: str, replica: Replica) -> None:
        """A request on ``replica`` ended: free its slot and hand it to the next waiter."""
        self._routes[model].replicas.release(replica)
        self._routes[model].fair.dispatch(lambda key: self._reserve(model, key))

    async def _wait_cold(self, model: Model, arrival: float) -> None:
        r = self._routes[model.name]
        now = self.clock()
        if r.replicas.backing_off(now) or r.replicas.at_capacity():
            until = r.replicas.backoff_until or now
            raise self._refusal(model.resolved_served_name, r.replicas, now,
                                f"the next attempt is in {until - now:.0f} s")
        a = model.autoscaling
        if len(r.cold) >= a.max_queue_length:
            raise TooManyRequests(
                f"model {model.resolved_served_name!r} is starting and its queue is full "
                f"({a.max_queue_length} requests waiting); retry shortly",
                retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
            )
        deadline = arrival + a.activation_timeout_s
        while not r.replicas.usable:
            self.feed.signal_demand(model.name)
            try:
                await r.cold.wait(max(deadline - self.clock(), 0.0))
            except TimeoutError:
                raise ServiceUnavailable(
                    f"model {model.resolved_served_name!r} did not become ready within "
                    f"{a.activation_timeout_s:.0f} s; retry later",
                    retry_after_s=TIMEOUT_RETRY_AFTER_S,
                ) from None
            # Woken with no replica (it went away again): wait again, same deadline.

    async def _wait_fair(self, model: Model, arrival: float, key: str | None, tenant: str) -> Replica:
        r = self._routes[model.name]
        a = model.autoscaling
        if len(r.fair) >= a.max_queue_length:
            raise TooManyRequests(
                f"model {model.resolved_served_name!r} is at capacity and its queue is full "
                f"({a.max_queue_length} requests waiting); retry shortly",
                retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
            )
        fut = r.fair.join(tenant, key)
        if self._yield_batch is not None:
            # A batch request on this model gives its slot to this one (handed on as
            # the cut request releases it).
            self._yield_batch(model.name)
        self.feed.signal_demand(model.name)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(arrival + a.activation_timeout_s - self.clock(), 0.0))
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()  # handed a slot just as the deadline passed
            fut.cancel()
            raise ServiceUnavailable(
                f"model {model.resolved_served_name!r} stayed at capacity for "
                f"{a.activation_timeout_s:.0f} s; retry later", retry_after_s=TIMEOUT_RETRY_AFTER_S,
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(model.name, fut.result())  # the client left after getting a slot
            fut.cancel()
            raise

    # -- ejection ---------------------------------------------------------------------------
    def eject(self, model: str, url: str) -> None:
        """Send no request to a replica that failed before its first byte (refused,
        dropped or stalled) for ``ejection_s``, whatever the tables say meanwhile: the
        controller may still list it (a link broken between this activator and it, not
        the controller). Then it is tried again; if it fails again, ejected again."""
        now = self.clock()
        until = now + self.ejection_s
        self._routes[model].replicas.eject(url, until, now)
        asyncio.get_running_loop().call_later(self.ejection_s, self._readmit, model, url, until)

    def _readmit(self, model: str, url: str, until: float) -> None:
        replicas = self._routes[model].replicas
        replicas.readmit(url, until, self.clock())
        if replicas.usable:
            self._wake(model)

    # -- batch: room online traffic leaves, given back the moment it wants it ------------
    def yield_batch_with(self, cut: Callable[[str], None]) -> None:
        """``cut(model)`` ends one batch request on ``model`` (its slot goes to the online
        request that found every slot taken and now waits)."""
        self._yield_batch = cut

    def batch_room(self, model: str, share: float, running: int) -> int:
        """How many more batch requests ``model`` takes now, ``running`` being run: none
        while an online request waits for it; else up to ``share`` of its replicas'
        slots in all (all of those of a replica placed for batch), within the free ones."""
        r, m = self._routes.get(model), self.models.get(model)
        if r is None or m is None or not r.replicas.usable or len(r.cold) or len(r.fair):
            return 0
        return r.replicas.batch_room(m.autoscaling.max_concurrency_per_replica, share, running)

    def take_batch_slot(self, model: str) -> Replica | None:
        """A free slot for a batch request (``release`` frees it), if no online request
        waits for one."""
        r = self._routes.get(model)
        if r is None or len(r.cold) or len(r.fair):
            return None
        return self._reserve(model)

    def taken_back(self, rep: Replica) -> bool:
        """Whether the worker of ``rep`` (a standby lent to batch) now serves another
        assignment in the route table: the controller took it back for online work."""
        return any(r.replicas.serves_other(rep) for r in self._routes.values())

    # -- telling the controller -------------------------------------------------------------
    def record_cold_start(self, record: ColdStartRecord) -> None:
        r = self._routes.get(record.model)
        if r is not None:
            r.cold_totals.append(record.total_s)
        self.feed.record_cold_start(record)

    def report_body(self) -> ActivityReport:
        """This activator's traffic; takes the TTFT samples it reports. A model it never
        had a request for is left out (with thousands of models most are: the controller
        counts a model left out as one with no traffic here)."""
        return ActivityReport(activator_id=self.feed.activator_id, models={
            name: r.activity.report(queued=len(r.cold) + len(r.fair)) for name, r in self._routes.items()
            if r.activity.last_request_at is not None or r.cold or r.fair})
