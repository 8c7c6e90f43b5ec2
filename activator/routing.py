"""The activator's view of where each model runs, and the cold queue of each model.

``RouteWatcher`` long-polls the pool manager's route table. A request for a model with
a ready replica gets one at once (least outstanding requests); otherwise it waits in
the model's cold queue — bounded, FIFO, with a deadline — while the pool manager is
told about the demand. When replicas appear the waiters are released in arrival
order; when the model's load fails they all get the reason at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from activator.errors import ServiceUnavailable, TooManyRequests
from activator.router import choose
from thaw.config import Model
from thaw.log import get_logger

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


@dataclass
class ModelRoutes:
    replicas: list[Replica] = field(default_factory=list)
    loading: int = 0
    failures: int = 0
    error: str | None = None
    backoff_until: float | None = None
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    in_flight: int = 0
    last_request_at: float | None = None


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
        clock: Callable[[], float] = time.time,
        report_interval_s: float = 1.0,
        on_replica: Callable[[bool, str, str, float], None] | None = None,
    ) -> None:
        self.models = {m.name: m for m in models}
        self.pool_url = pool_url.rstrip("/")
        self.activator_id = activator_id
        self.clock = clock
        self.report_interval_s = report_interval_s
        # Told (up, replica id, model, time) when a replica appears or goes: the ledger
        # keeps replica lifetimes for GPU-second attribution.
        self.on_replica = on_replica
        self.routes: dict[str, ModelRoutes] = {m.name: ModelRoutes() for m in models}
        self.version = -1
        self.connected = False
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(65.0, connect=2.0))
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="route-watch"),
            asyncio.create_task(self._report_loop(), name="activity-report"),
        ]

    async def close(self) -> None:
        for t in self._tasks + list(self._side):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        await self._http.aclose()

    # -- route table ----------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            try:
                r = await self._http.get(f"{self.pool_url}/v1/routes",
                                         params={"since": self.version, "wait_s": 25})
                r.raise_for_status()
                self.apply(r.json())
                self.connected = True
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                if self.connected:
                    log.warning("pool_unreachable", error=str(exc))
                self.connected = False
                await asyncio.sleep(0.5)

    def apply(self, table: dict[str, Any]) -> None:
        """Take in a route table from the pool manager and wake or fail waiters."""
        self.version = int(table["version"])
        now = self.clock()
        for name, entry in table["models"].items():
            st = self.routes.get(name)
            if st is None:
                continue
            old = {r.url: r for r in st.replicas}
            st.replicas = []
            for r in entry["replicas"]:
                prev = old.get(r["url"])
                rep = Replica(r["worker_id"], r["url"], r["served_model_name"], r.get("assignment_id"),
                              r.get("phases") or {})
                if prev is not None and prev.assignment_id == rep.assignment_id:
                    rep.outstanding = prev.outstanding
                st.replicas.append(rep)
            if self.on_replica is not None:
                before = {r.assignment_id or r.url for r in old.values()}
                after = {r.assignment_id or r.url for r in st.replicas}
                for rid in after - before:
                    self.on_replica(True, rid, name, now)
                for rid in before - after:
                    self.on_replica(False, rid, name, now)
            new_failure = entry["failures"] > st.failures and entry["error"]
            st.loading = entry["loading"]
            st.failures = entry["failures"]
            st.error = entry["error"]
            st.backoff_until = entry["backoff_until"]
            if st.replicas:
                self._release_waiters(st)
            elif new_failure:
                retry = (st.backoff_until - now) if st.backoff_until else TIMEOUT_RETRY_AFTER_S
                exc = ServiceUnavailable(
                    f"model {name!r} failed to start: {st.error}; retrying after a backoff",
                    retry_after_s=retry,
                )
                while st.waiters:
                    fut = st.waiters.popleft()
                    if not fut.done():
                        fut.set_exception(exc)

    @staticmethod
    def _release_waiters(st: ModelRoutes) -> None:
        # In arrival order: each resumed waiter picks its replica in this order.
        while st.waiters:
            fut = st.waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    # -- picking a replica ----------------------------------------------------------
    def pick(self, model: str, key: str | None = None) -> Replica | None:
        """A ready replica: prefix affinity with bounded load (``activator.router``)."""
        return choose(self.routes[model].replicas, key)  # type: ignore[return-value]

    def drop_replica(self, model: str, url: str) -> None:
        """Stop using a replica that failed before its first byte, until the next table."""
        st = self.routes[model]
        st.replicas = [r for r in st.replicas if r.url != url]

    def state_of(self, model: str) -> str:
        st = self.routes[model]
        if st.replicas:
            return "ready"
        if st.loading:
            return "loading"
        if st.backoff_until and st.backoff_until > self.clock():
            return "failed"
        return "cold"

    async def acquire(self, model: Model, arrival: float, key: str | None = None) -> Acquired:
        """A replica for ``model``, waiting in its cold queue if none is ready."""
        rep = self.pick(model.name, key)
        if rep is not None:
            return Acquired(rep, cold=False, queue_s=0.0)
        st = self.routes[model.name]
        now = self.clock()
        if st.backoff_until and st.backoff_until > now and not st.loading and st.error:
            raise ServiceUnavailable(
                f"model {model.resolved_served_name!r} failed to start: {st.error}; "
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
        while True:
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
            rep = self.pick(model.name, key)
            if rep is not None:
                return Acquired(rep, cold=True, queue_s=self.clock() - arrival)
            # The replica went away between wake-up and pick: wait again, same deadline.

    def queue_depth(self, model: str) -> int:
        return len(self.routes[model].waiters)

    # -- telling the pool manager ---------------------------------------------------
    def signal_demand(self, model: str) -> None:
        task = asyncio.create_task(self._post("/v1/demand", {"model": model}))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        try:
            r = await self._http.post(f"{self.pool_url}{path}", json=body, timeout=5.0)
            if r.status_code >= 400:
                log.warning("pool_post_refused", path=path, status=r.status_code)
        except httpx.HTTPError as exc:
            log.warning("pool_post_failed", path=path, error=str(exc))

    def record_cold_start(self, record: dict[str, Any]) -> None:
        task = asyncio.create_task(self._post("/v1/cold_starts", record))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    def report_body(self) -> dict[str, Any]:
        return {"activator_id": self.activator_id, "models": {
            name: {"queued": len(st.waiters), "in_flight": st.in_flight, "last_request_at": st.last_request_at}
            for name, st in self.routes.items()
        }}

    async def _report_loop(self) -> None:
        while True:
            await self._post("/v1/reports", self.report_body())
            await asyncio.sleep(self.report_interval_s)
