"""This activator's link to the controller: the long poll of the route table, the tables
it versions (API keys, catalog) fetched when they change, and what the activator tells
the controller (demand, cold starts, its traffic reports).

The feed holds the whole table (``table``) only to merge the controller's deltas into
it: each answer goes to ``on_table`` (``Router.apply``) as it came, a delta naming only
the models that changed. A delta on a version this activator does not hold is dropped
and the whole table asked for. While the controller is away the activator keeps serving
from the last table. The catalog is fetched as deltas the same way (``Followed.merge``;
docs/REQUEST_PATH.md, "The catalog feed").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel

from thaw.auth import bearer
from thaw.controllers import Controllers
from thaw.log import get_logger
from thaw.telemetry import TraceContext
from thaw.wire import MAX_DEMAND_MODELS, ActivityReport, ColdStartRecord, DemandSignal, RouteTable

log = get_logger()

# Demand signals on their way to the controller at once (each names every model that
# came to wait since the last one left).
DEMAND_SENDERS = 4


@dataclass
class Followed:
    """A table the controller versions in the route table (``GET path``).

    ``on`` is given each whole table taken. A table the controller answers with deltas
    (``merge``: the whole table a delta makes of the one held, None when the delta was
    made from another version) is asked for with ``since=<held>&delta=true``, and ``on``
    is given the answer it was merged from too (a delta, or the same whole table)."""

    path: str
    parse: Callable[[bytes], Any]
    on: Callable[..., Awaitable[None]]
    # The version this activator holds, and the one the last route table named.
    held: int = 0
    listed: int = 0
    wanted: asyncio.Event = field(default_factory=asyncio.Event)
    merge: Callable[[Any, Any], Any | None] | None = None
    # The whole table held (``merge``: what deltas merge into; None: none yet), and
    # whether the next fetch asks for the whole table (a delta did not fit it).
    table: Any = None
    whole: bool = False

    def params(self) -> dict[str, Any] | None:
        """The fetch's query: the version held, for a table that merges deltas."""
        if self.merge is None:
            return None
        return {"since": -1 if self.table is None or self.whole else self.held, "delta": "true"}

    def take(self, update: Any) -> Any | None:
        """The whole table ``update`` makes (None: a delta that does not fit the table
        held; the next fetch asks for the whole table)."""
        if self.merge is None:
            return update
        if self.table is not None:
            table = self.merge(self.table, update)
        else:
            table = update if update.base_version is None else None  # a delta needs a table held
        self.whole = table is None
        if table is not None:
            self.table = table
        return table


class ControllerFeed:
    def __init__(
        self,
        pool_url: str,
        activator_id: str,
        *,
        on_table: Callable[[RouteTable], None],
        report: Callable[[], ActivityReport],
        followed: dict[str, Followed] | None = None,
        token: str | None = None,
        report_interval_s: float = 1.0,
    ) -> None:
        # The controllers (``URL[,URL]``): calls go to the leader among them.
        self.controllers = Controllers(pool_url)
        self.activator_id = activator_id
        self._on_table = on_table
        self._report = report
        self.report_interval_s = report_interval_s
        # The tables the route table carries the version of, each fetched when its
        # version there differs from the one this activator holds.
        self.followed: dict[str, Followed] = followed or {}
        self.version = -1
        # Activators the controller hears from (this one included): each one's share of
        # a limit when the shared limits store cannot be reached.
        self.activators = 1
        # The controller start the table came from: a restarted controller counts its
        # versions from 1 again, so a new epoch is taken whatever its version.
        self.epoch: str | None = None
        # The whole table as of ``version`` (None: none yet), what deltas merge into, and
        # whether the next poll asks for the whole table (a delta did not fit it).
        self.table: RouteTable | None = None
        self._whole = False
        self.connected = False
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(65.0, connect=2.0),
                                       headers=bearer(token) if token else None)
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[Any]] = set()
        self._demand_in_flight: set[str] = set()
        # Waiting for a sender, in order, each with the traceparent of its request (or None).
        self._demand_pending: dict[str, str | None] = {}
        self._demand_senders = 0
        self.demand_coalesced = 0

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="route-watch"),
            asyncio.create_task(self._report_loop(), name="activity-report"),
        ]
        for name, f in self.followed.items():
            self._tasks.append(asyncio.create_task(self._follow(f), name=f"{name}-fetch"))

    async def close(self) -> None:
        for t in self._tasks + list(self._side):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._side, return_exceptions=True)
        await self._http.aclose()

    @property
    def keys_version(self) -> int:
        """The version of the key table this activator holds."""
        return self.followed["keys"].held if "keys" in self.followed else 0

    def track(self, table: RouteTable) -> None:
        """Where ``table`` puts this activator: its version and epoch (the next long
        poll's), the activators counted, and which followed tables to fetch again."""
        self.version = table.version
        self.epoch = table.epoch
        self.activators = table.activators
        for name, listed in (("keys", table.keys_version), ("catalog", table.catalog_version)):
            if (f := self.followed.get(name)) is not None:
                f.listed = listed
                if listed != f.held:
                    f.wanted.set()

    def take(self, update: RouteTable) -> bool:
        """Take in the controller's answer (a whole table or a delta): merged into the
        table held and handed to ``on_table``; whether it was taken. A delta made from
        another version than the one held is not: the next poll asks for the whole table."""
        if self.table is not None:
            table = self.table.merged(update)
        else:
            table = update if update.base_version is None else None
        if table is None:
            log.info("route_delta_dropped", held=self.version, base=update.base_version, version=update.version)
            self._whole = True
            return False
        self.table, self._whole = table, False
        self.track(table)
        self._on_table(update)
        return True

    async def _watch(self) -> None:
        while True:
            try:
                params: dict[str, Any] = {"since": -1 if self._whole else self.version, "wait_s": 25,
                                          "delta": "true"}
                if self.epoch is not None:
                    params["epoch"] = self.epoch
                r = await self.controllers.request(self._http, "GET", "/v1/routes", params=params)
                r.raise_for_status()
                self.take(RouteTable.model_validate_json(r.content))
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

    async def _follow(self, f: Followed) -> None:
        """Fetch a followed table whenever the route table says it changed (the long poll
        answers at once, so a revoked key or a removed model reaches this activator
        within a second)."""
        while True:
            await f.wanted.wait()
            f.wanted.clear()
            try:
                r = await self.controllers.request(self._http, "GET", f.path, params=f.params(), timeout=5.0)
                r.raise_for_status()
                update = f.parse(r.content)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("table_fetch_failed", path=f.path, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(0.5)
                f.wanted.set()
                continue
            table = f.take(update)
            if table is None:
                log.info("table_delta_dropped", path=f.path, held=f.held, base=update.base_version,
                         version=update.version)
                f.wanted.set()
                continue
            await (f.on(table) if f.merge is None else f.on(table, update))
            f.held = table.version
            if f.listed != table.version:
                f.wanted.set()  # it moved again while this fetch ran

    # -- telling the controller ---------------------------------------------------------
    def signal_demand(self, model: str, trace: TraceContext | None = None) -> None:
        """Tell the controller a request waits for ``model``; one signal in flight per
        model at most (a burst of waiting requests is one signal, not one each). At most
        ``DEMAND_SENDERS`` signals are on their way at once; the models that come to wait
        meanwhile go together in the next (a burst of a thousand models at zero is a few
        requests to the controller, not a thousand). ``trace``: the waiting request's,
        which the controller's spans of the start it makes join."""
        if model in self._demand_in_flight:
            self.demand_coalesced += 1
            return
        self._demand_in_flight.add(model)
        self._demand_pending[model] = trace.traceparent() if trace is not None else None
        if self._demand_senders < DEMAND_SENDERS:
            self._demand_senders += 1
            task = asyncio.create_task(self._send_demand())
            self._side.add(task)
            task.add_done_callback(self._side.discard)

    async def _send_demand(self) -> None:
        try:
            while self._demand_pending:
                batch = list(itertools.islice(self._demand_pending, MAX_DEMAND_MODELS))
                traces = {name: tp for name in batch if (tp := self._demand_pending.pop(name))}
                try:
                    await self._post("/v1/demand", DemandSignal(models=batch, traces=traces))
                finally:
                    self._demand_in_flight.difference_update(batch)
        finally:
            self._demand_senders -= 1

    def demand_in_flight(self, model: str) -> bool:
        """Whether a demand signal for ``model`` is on its way."""
        return model in self._demand_in_flight

    def record_cold_start(self, record: ColdStartRecord) -> None:
        task = asyncio.create_task(self._post("/v1/cold_starts", record))
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _post(self, path: str, body: BaseModel) -> None:
        try:
            r = await self.controllers.request(self._http, "POST", path, content=body.model_dump_json(),
                                               headers={"content-type": "application/json"}, timeout=5.0)
            if r.status_code >= 400:
                log.warning("pool_post_refused", path=path, status=r.status_code)
        except httpx.HTTPError as exc:
            if self.connected:  # while the controller is away, the watcher has said so
                log.warning("pool_post_failed", path=path, error=str(exc) or type(exc).__name__)

    async def _report_loop(self) -> None:
        while True:
            await self._post("/v1/reports", self._report())
            await asyncio.sleep(self.report_interval_s)
