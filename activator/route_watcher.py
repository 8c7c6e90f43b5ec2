"""The activator's view of where each model runs, and the cold queue of each model.

``RouteWatcher`` long-polls the pool manager's route table. A request for a model with
a ready replica gets one at once (least outstanding requests); otherwise it waits in
the model's cold queue — bounded, FIFO, with a deadline — while the pool manager is
told about the demand. When replicas appear the waiters are released in arrival
order; when the model's load fails they all get the reason at once.

One piece: the route table, the cold queues and the fair queues change together on
every table and every request; their invariants are checked in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel

from activator.errors import NotFound, ServiceUnavailable, TooManyRequests
from activator.replica_choice import choose
from thaw.auth import bearer
from thaw.config import Model
from thaw.controllers import Controllers
from thaw.log import get_logger
from thaw.wire import (
    MAX_TTFT_SAMPLES,
    ActivityReport,
    Catalog,
    ColdStartRecord,
    DemandSignal,
    KeyTable,
    ModelActivityReport,
    RouteTable,
    Tier,
)

log = get_logger()

QUEUE_FULL_RETRY_AFTER_S = 2.0
TIMEOUT_RETRY_AFTER_S = 5.0


@dataclass
class Replica:
    worker_id: str
    url: str
    served_model_name: str
    assignment_id: str | None
    phases: dict[str, float | None]
    outstanding: int = 0
    # Where the worker read the weights from (thaw.wire.LoadView.tier), how long its
    # loader took, and when the worker's agent started.
    load_tier: str | None = None
    load_s: float | None = None
    # The weights were swapped into an engine built before (thaw.wire.LoadView.swap).
    load_swap: bool = False
    # Its steps (thaw.wire.LoadView.steps_s).
    swap_steps_s: dict[str, float] = field(default_factory=dict)
    worker_started_at: float | None = None
    # An engine packed beside others on a worker that was serving (thaw.wire.ReplicaRoute).
    packed: bool = False
    # A LoRA adapter in an engine of its base, and when that engine became ready.
    adapter: bool = False
    base_ready_at: float | None = None
    # The model's registry revision it serves (thaw.wire.ReplicaRoute.revision).
    revision: int | None = None
    # Placed for batch work: batch may take all its slots (online traffic still first).
    batch: bool = False


def cold_start_tier(waiting_since: float, rep: Replica) -> Tier:
    """Where the replica that ended a cold start got its model from: woken from sleep, a
    worker launched after the request started waiting (a packed engine is no launch: its
    worker was serving), weights swapped into an engine built before, else where its
    loader read the weights (host memory, local disk, the store)."""
    if rep.phases.get("woken") is not None or rep.load_tier == "asleep":
        return "asleep"
    if rep.adapter and rep.base_ready_at is not None and rep.base_ready_at <= waiting_since:
        # Its base was serving before the request: only the adapter was loaded. (A base
        # brought up for it: where the base came from, below.)
        return "adapter"
    if rep.packed:
        return "packed"
    if rep.worker_started_at is not None and rep.worker_started_at > waiting_since:
        return "launch"
    if rep.load_swap:
        return "swap"
    if rep.load_tier in ("host", "disk"):
        return rep.load_tier  # type: ignore[return-value]
    # Configured models live in the store; a loader that reports nothing read them there.
    return "s3"


# What a tenant is told when its model's load failed: the kind of failure
# (thaw.wire.FailureKind, from the exception types on the worker), never the operator's
# details (store endpoints, bucket paths, hashes, tracebacks: those are in the
# controller's state, `thaw status` and the logs).
PUBLIC_FAILURES: dict[str | None, str] = {
    "weights_integrity": "its weights do not match their manifest (sha256, size or format)",
    "store": "its weights could not be read from the object store",
    "memory": "it does not fit in the worker's memory",
    "engine": "its engine did not start",
}


def public_failure(kind: str | None) -> str:
    """The reason a model failed to start, as its callers may see it."""
    return PUBLIC_FAILURES.get(kind, PUBLIC_FAILURES["engine"])


@dataclass
class Followed:
    """A table the controller versions in the route table (``GET path``)."""

    path: str
    parse: Callable[[bytes], Any]
    on: Callable[[Any], Awaitable[None]]
    # The version this activator holds, and the one the last route table named.
    held: int = 0
    listed: int = 0
    wanted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class ModelRoutes:
    replicas: list[Replica] = field(default_factory=list)
    loading: int = 0
    failures: int = 0
    error: str | None = None
    # The last failure's kind (thaw.wire.FailureKind): what callers are told.
    failure_kind: str | None = None
    backoff_until: float | None = None
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    # The replicas the last table listed; ``replicas`` is these less the ejected ones
    # (url -> until when, clock time): replicas that failed before a first byte here.
    listed: list[Replica] = field(default_factory=list)
    ejected: dict[str, float] = field(default_factory=dict)
    # Requests waiting for a slot on saturated replicas, per tenant, served round-robin.
    fair: dict[str, deque[tuple[asyncio.Future[Replica], str | None]]] = field(default_factory=dict)
    fair_order: deque[str] = field(default_factory=deque)
    in_flight: int = 0
    last_request_at: float | None = None
    # Requests accepted since start (reported as a counter), and hot TTFTs since the
    # last report (a bounded sample).
    arrivals: int = 0
    ttfts: list[float] = field(default_factory=list)

    def note_ttft(self, seconds: float) -> None:
        if len(self.ttfts) < MAX_TTFT_SAMPLES:
            self.ttfts.append(seconds)


@dataclass(frozen=True)
class Acquired:
    replica: Replica
    cold: bool
    queue_s: float


class RouteWatcher:
    def __init__(
        self,
        models: list[Model],
        pool_url: str,
        activator_id: str,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        report_interval_s: float = 1.0,
        on_replica: Callable[[bool, str, str, float], None] | None = None,
        on_keys: Callable[[KeyTable], Awaitable[None]] | None = None,
        keys_version: int | None = None,
        on_catalog: Callable[[Catalog], Awaitable[None]] | None = None,
        catalog_version: int | None = None,
        ejection_s: float = 10.0,
    ) -> None:
        self.models = {m.name: m for m in models}
        self.ejection_s = ejection_s
        # The controllers (``URL[,URL]``): calls go to the leader among them.
        self.controllers = Controllers(pool_url)
        self.activator_id = activator_id
        self.clock = clock
        self.report_interval_s = report_interval_s
        # Told (up, replica id, model, time) when a replica appears or goes: the ledger
        # keeps replica lifetimes for GPU-second attribution.
        self.on_replica = on_replica
        # The tables the route table carries the version of, each fetched when its
        # version there differs from the one this activator holds (None known: version
        # 0, the controller's before any change): the API keys (``on_keys``) and the
        # models and tenants in force (``on_catalog``).
        self.followed: dict[str, Followed] = {}
        if on_keys is not None:
            self.followed["keys"] = Followed("/v1/keys", KeyTable.model_validate_json, on_keys, keys_version or 0)
        if on_catalog is not None:
            self.followed["catalog"] = Followed("/v1/catalog", Catalog.model_validate_json, on_catalog,
                                                catalog_version or 0)
        self.routes: dict[str, ModelRoutes] = {m.name: ModelRoutes() for m in models}
        # Set by the batch worker: cut one of its requests on a model, for an online
        # request that found every slot taken.
        self.yield_batch: Callable[[str], None] | None = None
        self.version = -1
        # Activators the controller hears from (this one included): each one's share of
        # a limit when the shared limits store cannot be reached.
        self.activators = 1
        # The controller start the table came from: a restarted controller counts its
        # versions from 1 again, so a new epoch is taken whatever its version.
        self.epoch: str | None = None
        self.connected = False
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(65.0, connect=2.0),
                                       headers=bearer(token) if token else None)
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[Any]] = set()
        self._demand_in_flight: set[str] = set()
        self.demand_coalesced = 0

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="route-watch"),
            asyncio.create_task(self._report_loop(), name="activity-report"),
        ]
        for name, f in self.followed.items():
            self._tasks.append(asyncio.create_task(self._follow(f), name=f"{name}-fetch"))

    @property
    def keys_version(self) -> int:
        """The version of the key table this activator holds."""
        return self.followed["keys"].held if "keys" in self.followed else 0

    def set_models(self, models: list[Model]) -> None:
        """The models in force changed (the catalog): new ones get routes; a removed
        one's waiting requests are told it does not exist, its requests in flight finish."""
        self.models = {m.name: m for m in models}
        for m in models:
            self.routes.setdefault(m.name, ModelRoutes())
        for name, st in self.routes.items():
            if name in self.models:
                continue
            gone = NotFound(f"the model {name!r} does not exist", param="model")
            while st.waiters:
                fut = st.waiters.popleft()
                if not fut.done():
                    fut.set_exception(gone)
            for queue in st.fair.values():
                for slot, _ in queue:
                    if not slot.done():
                        slot.set_exception(gone)
                queue.clear()

    async def close(self) -> None:
        for t in self._tasks + list(self._side):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        await self._http.aclose()

    # -- route table ----------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            try:
                params: dict[str, Any] = {"since": self.version, "wait_s": 25}
                if self.epoch is not None:
                    params["epoch"] = self.epoch
                r = await self.controllers.request(self._http, "GET", "/v1/routes", params=params)
                r.raise_for_status()
                self.apply(RouteTable.model_validate_json(r.content))
                if not self.connected:
                    log.info("controller_connected", epoch=self.epoch, version=self.version)
                self.connected = True
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError) as exc:
                # Keep serving from the last table: hot models stay hot while the
                # controller is away; cold requests wait within their deadline.
                if self.connected:
                    log.warning("pool_unreachable", error=str(exc) or type(exc).__name__)
                self.connected = False
                await asyncio.sleep(0.5)

    def apply(self, table: RouteTable) -> None:
        """Take in a route table from the controller and wake or fail waiters."""
        self.version = table.version
        self.epoch = table.epoch
        self.activators = table.activators
        for name, listed in (("keys", table.keys_version), ("catalog", table.catalog_version)):
            if (f := self.followed.get(name)) is not None:
                f.listed = listed
                if listed != f.held:
                    f.wanted.set()
        now = self.clock()
        for name, entry in table.models.items():
            st = self.routes.get(name)
            if st is None:
                continue
            old = {r.url: r for r in st.listed}
            st.listed = []
            for r in entry.replicas:
                prev = old.get(r.url)
                rep = Replica(r.worker_id, r.url, r.served_model_name, r.assignment_id,
                              r.phases.model_dump(), load_tier=r.load.tier if r.load else None,
                              load_s=r.load.seconds if r.load else None, worker_started_at=r.worker_started_at,
                              load_swap=r.load.swap if r.load else False,
                              swap_steps_s=dict(r.load.steps_s) if r.load else {}, packed=r.packed, adapter=r.adapter,
                              base_ready_at=r.base_ready_at, revision=r.revision, batch=r.batch)
                if prev is not None and prev.assignment_id == rep.assignment_id:
                    rep.outstanding = prev.outstanding
                st.listed.append(rep)
            self._usable(st, now)
            if self.on_replica is not None:
                before = {r.assignment_id or r.url for r in old.values()}
                after = {r.assignment_id or r.url for r in st.listed}
                for rid in after - before:
                    self.on_replica(True, rid, name, now)
                for rid in before - after:
                    self.on_replica(False, rid, name, now)
            new_failure = entry.failures > st.failures and entry.error
            st.loading = entry.loading
            st.failures = entry.failures
            st.error = entry.error
            st.failure_kind = entry.failure_kind
            st.backoff_until = entry.backoff_until
            if st.replicas:
                self._release_waiters(st)
                self._dispatch_fair(name)
            elif new_failure:
                retry = (st.backoff_until - now) if st.backoff_until else TIMEOUT_RETRY_AFTER_S
                served = m.resolved_served_name if (m := self.models.get(name)) else name
                exc = ServiceUnavailable(
                    f"model {served!r} failed to start: {public_failure(st.failure_kind)}; retrying after a backoff",
                    retry_after_s=retry,
                )
                while st.waiters:
                    fut = st.waiters.popleft()
                    if not fut.done():
                        fut.set_exception(exc)

    async def _follow(self, f: Followed) -> None:
        """Fetch a followed table whenever the route table says it changed (the long poll
        answers at once, so a revoked key or a removed model reaches this activator
        within a second)."""
        while True:
            await f.wanted.wait()
            f.wanted.clear()
            try:
                r = await self.controllers.request(self._http, "GET", f.path, timeout=5.0)
                r.raise_for_status()
                table = f.parse(r.content)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("table_fetch_failed", path=f.path, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(0.5)
                f.wanted.set()
                continue
            await f.on(table)
            f.held = table.version
            if f.listed != table.version:
                f.wanted.set()  # it moved again while this fetch ran

    @staticmethod
    def _release_waiters(st: ModelRoutes) -> None:
        # In arrival order: each resumed waiter picks its replica in this order.
        while st.waiters:
            fut = st.waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    # -- picking a replica ----------------------------------------------------------
    def pick(self, model: str, key: str | None = None) -> Replica | None:
        """A ready replica with a free slot: prefix affinity with bounded load."""
        m = self.models.get(model)
        if m is None:  # removed since the request was admitted: no new replica for it
            return None
        cap = m.autoscaling.max_concurrency_per_replica
        free = [r for r in self.routes[model].replicas if r.outstanding < cap]
        return choose(free, key)  # type: ignore[return-value]

    # -- a request's life, as the service reports it (the only writers of these counts) --

    def arrive(self, model: str, now: float) -> bool:
        """A request for ``model`` arrived: counted; whether it finds no ready replica
        (part of a cold start, answered or not; all replicas busy is not one)."""
        st = self.routes[model]
        st.last_request_at = now
        st.arrivals += 1
        return not st.replicas

    def started(self, model: str) -> None:
        """A request acquired its replica and is being sent."""
        self.routes[model].in_flight += 1

    def ended(self, model: str, now: float, replica: Replica | None = None) -> None:
        """A started request ended (``replica``: its slot is freed too)."""
        if replica is not None:
            self.release(model, replica)
        st = self.routes[model]
        st.in_flight -= 1
        st.last_request_at = now

    def note_ttft(self, model: str, seconds: float) -> None:
        """A hot request's time to first byte (the autoscaler's TTFT target)."""
        self.routes[model].note_ttft(seconds)

    def fair_depth(self, model: str) -> int:
        return sum(len(q) for q in self.routes[model].fair.values())

    def release(self, model: str, replica: Replica) -> None:
        """A request on ``replica`` ended: free its slot and hand it to the next waiter.

        A route table taken in since the request began holds a new ``Replica`` for the
        same assignment, which carried the count over: the slot is freed there too
        (else every table that arrives during a request would leak one slot)."""
        replica.outstanding = max(replica.outstanding - 1, 0)
        for live in self.routes[model].listed:
            if live is not replica and live.url == replica.url and live.assignment_id == replica.assignment_id:
                live.outstanding = max(live.outstanding - 1, 0)
        self._dispatch_fair(model)

    def _dispatch_fair(self, model: str) -> None:
        st = self.routes[model]
        while st.fair_order:
            tenant = st.fair_order[0]
            queue = st.fair.get(tenant)
            while queue and queue[0][0].done():
                queue.popleft()  # timed out or cancelled
            if not queue:
                st.fair_order.popleft()
                st.fair.pop(tenant, None)
                continue
            rep = self.pick(model, queue[0][1])
            if rep is None:
                return  # still saturated
            fut, _ = queue.popleft()
            # Round-robin: this tenant goes to the back of the line.
            st.fair_order.rotate(-1)
            if not queue:
                st.fair_order.remove(tenant)
                st.fair.pop(tenant, None)
            rep.outstanding += 1
            fut.set_result(rep)

    @staticmethod
    def _usable(st: ModelRoutes, now: float) -> None:
        """``replicas``: the listed ones but those ejected until later than ``now``."""
        for url in [u for u, until in st.ejected.items() if until <= now]:
            del st.ejected[url]
        st.replicas = [r for r in st.listed if r.url not in st.ejected] if st.ejected else list(st.listed)

    def eject(self, model: str, url: str) -> None:
        """Send no request to a replica that failed before its first byte (refused,
        dropped or stalled) for ``ejection_s``, whatever the tables say meanwhile: the
        controller may still list it (a link broken between this activator and it, not
        the controller). Then it is tried again; if it fails again, ejected again."""
        st, now = self.routes[model], self.clock()
        until = st.ejected[url] = now + self.ejection_s
        self._usable(st, now)
        asyncio.get_running_loop().call_later(self.ejection_s, self._readmit, model, url, until)

    def _readmit(self, model: str, url: str, until: float) -> None:
        st = self.routes[model]
        if st.ejected.get(url) == until:  # not ejected again since
            del st.ejected[url]
        self._usable(st, self.clock())
        if st.replicas:
            self._release_waiters(st)
            self._dispatch_fair(model)

    def state_of(self, model: str) -> str:
        st = self.routes[model]
        if st.replicas:
            return "ready"
        if st.loading:
            return "loading"
        if st.backoff_until and st.backoff_until > self.clock():
            return "failed"
        return "cold"

    # -- batch: room online traffic leaves, given back the moment it wants it --------
    def batch_room(self, model: str, share: float, running: int) -> int:
        """How many more batch requests ``model`` takes now, ``running`` being run: none
        while an online request waits for it; else up to ``share`` of its replicas'
        slots in all (all of those of a replica placed for batch), within the free ones."""
        st, m = self.routes.get(model), self.models.get(model)
        if st is None or m is None or not st.replicas or st.waiters or self.fair_depth(model):
            return 0
        cap = m.autoscaling.max_concurrency_per_replica
        free = sum(max(cap - r.outstanding, 0) for r in st.replicas)
        allowed = sum(cap if r.batch else cap * share for r in st.replicas)
        return max(0, min(int(allowed) - running, free))

    def taken_back(self, rep: Replica) -> bool:
        """Whether the worker of ``rep`` (a standby lent to batch) now serves another
        assignment in the route table: the controller took it back for online work."""
        return any(r.worker_id == rep.worker_id and r.assignment_id != rep.assignment_id
                   for st in self.routes.values() for r in st.listed)

    def take_batch_slot(self, model: str) -> Replica | None:
        """A free slot for a batch request (``release`` frees it), if no online request
        waits for one."""
        st = self.routes.get(model)
        if st is None or st.waiters or self.fair_depth(model):
            return None
        rep = self.pick(model)
        if rep is not None:
            rep.outstanding += 1
        return rep

    async def acquire(self, model: Model, arrival: float, key: str | None = None,
                      tenant: str = "") -> Acquired:
        """A replica slot for ``model`` (reserved: ``release`` frees it).

        No replica: wait in the model's cold queue. Replicas all busy: wait in the
        model's fair queue, served round-robin across tenants.
        """
        st = self.routes[model.name]
        cold = not st.replicas
        if cold:
            await self._wait_cold(model, arrival)
        rep = self.pick(model.name, key)
        if rep is None:
            rep = await self._wait_fair(model, arrival, key, tenant)
        else:
            rep.outstanding += 1
        return Acquired(rep, cold=cold, queue_s=(self.clock() - arrival) if cold else 0.0)

    async def _wait_fair(self, model: Model, arrival: float, key: str | None, tenant: str) -> Replica:
        st = self.routes[model.name]
        a = model.autoscaling
        if self.fair_depth(model.name) >= a.max_queue_length:
            raise TooManyRequests(
                f"model {model.resolved_served_name!r} is at capacity and its queue is full "
                f"({a.max_queue_length} requests waiting); retry shortly",
                retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
            )
        fut: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        st.fair.setdefault(tenant, deque()).append((fut, key))
        if tenant not in st.fair_order:
            st.fair_order.append(tenant)
        if self.yield_batch is not None:
            # A batch request on this model gives its slot to this one (handed on as
            # the cut request releases it).
            self.yield_batch(model.name)
        self.signal_demand(model.name)
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

    async def _wait_cold(self, model: Model, arrival: float) -> None:
        st = self.routes[model.name]
        now = self.clock()
        if st.backoff_until and st.backoff_until > now and not st.loading and st.error:
            raise ServiceUnavailable(
                f"model {model.resolved_served_name!r} failed to start: {public_failure(st.failure_kind)}; "
                f"the next attempt is in {st.backoff_until - now:.0f} s",
                retry_after_s=st.backoff_until - now,
            )
        a = model.autoscaling
        if len(st.waiters) >= a.max_queue_length:
            raise TooManyRequests(
                f"model {model.resolved_served_name!r} is starting and its queue is full "
                f"({a.max_queue_length} requests waiting); retry shortly",
                retry_after_s=QUEUE_FULL_RETRY_AFTER_S,
            )
        deadline = arrival + a.activation_timeout_s
        loop = asyncio.get_running_loop()
        while not st.replicas:
            fut: asyncio.Future[None] = loop.create_future()
            st.waiters.append(fut)
            self.signal_demand(model.name)
            try:
                await asyncio.wait_for(fut, max(deadline - self.clock(), 0.0))
            except TimeoutError:
                raise ServiceUnavailable(
                    f"model {model.resolved_served_name!r} did not become ready within "
                    f"{a.activation_timeout_s:.0f} s; retry later",
                    retry_after_s=TIMEOUT_RETRY_AFTER_S,
                ) from None
            finally:
                with contextlib.suppress(ValueError):
                    st.waiters.remove(fut)
            # Woken with no replica (it went away again): wait again, same deadline.

    def queue_depth(self, model: str) -> int:
        return len(self.routes[model].waiters)

    # -- telling the pool manager ---------------------------------------------------
    def signal_demand(self, model: str) -> None:
        """Tell the controller a request waits for ``model``; one signal in flight per
        model at most (a burst of waiting requests is one signal, not one each)."""
        if model in self._demand_in_flight:
            self.demand_coalesced += 1
            return
        self._demand_in_flight.add(model)
        task = asyncio.create_task(self._post("/v1/demand", DemandSignal(model=model)))
        self._side.add(task)
        task.add_done_callback(self._side.discard)
        task.add_done_callback(lambda _: self._demand_in_flight.discard(model))

    async def _post(self, path: str, body: BaseModel) -> None:
        try:
            r = await self.controllers.request(self._http, "POST", path, content=body.model_dump_json(),
                                               headers={"content-type": "application/json"}, timeout=5.0)
            if r.status_code >= 400:
                log.warning("pool_post_refused", path=path, status=r.status_code)
        except httpx.HTTPError as exc:
            if self.connected:  # while the controller is away, the watcher has said so
                log.warning("pool_post_failed", path=path, error=str(exc) or type(exc).__name__)

    def record_cold_start(self, record: ColdStartRecord) -> None:
        task = asyncio.create_task(self._post("/v1/cold_starts", record))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    def report_body(self) -> ActivityReport:
        """This activator's traffic; takes the TTFT samples it reports (a report that
        fails to arrive loses those samples, never the arrival counts)."""
        models = {}
        for name, st in self.routes.items():
            ttfts, st.ttfts = st.ttfts, []
            models[name] = ModelActivityReport(
                queued=len(st.waiters) + self.fair_depth(name), in_flight=st.in_flight,
                last_request_at=st.last_request_at, arrivals=st.arrivals, ttft_s=ttfts)
        return ActivityReport(activator_id=self.activator_id, models=models)

    async def _report_loop(self) -> None:
        while True:
            await self._post("/v1/reports", self.report_body())
            await asyncio.sleep(self.report_interval_s)
