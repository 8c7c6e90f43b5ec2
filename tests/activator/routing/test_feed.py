"""The activator's link to the controller: demand signals, what a route table says of
the versions it follows, the route feed's deltas merged into the table it holds, and the
catalog's the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvicorn
from fastapi import FastAPI, Query, Request, Response

from activator.routing.feed import DEMAND_SENDERS, ControllerFeed, Followed
from tests.activator.support import make_config
from tests.waiting import until
from thaw.config import Model, ThawConfig
from thaw.embedded_store import free_port
from thaw.wire import ActivityReport, Catalog, ModelRoute, ReplicaRoute, RouteTable
from warm_pool.registry.catalog import CatalogFeed
from warm_pool.routes import RouteFeed


@pytest.fixture
async def controller() -> AsyncIterator[tuple[str, list[str], list[list[str]]]]:
    """A controller that takes 0.3 s to answer a demand signal, and records them (the
    models signalled, and each signal's)."""
    seen: list[str] = []
    signals: list[list[str]] = []
    app = FastAPI()

    @app.post("/v1/demand")
    async def demand(request: Request) -> Response:
        models = (await request.json())["models"]
        seen.extend(models)
        signals.append(models)
        await asyncio.sleep(0.3)
        return Response(status_code=202)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    task = asyncio.create_task(server.serve())
    await until("the controller started", lambda: server.started)
    try:
        yield f"http://127.0.0.1:{port}", seen, signals
    finally:
        server.should_exit = True
        server.force_exit = True
        await task


def feed(url: str, followed: dict[str, Followed] | None = None) -> ControllerFeed:
    return ControllerFeed(url, "a1", on_table=lambda table: None,
                          report=lambda: ActivityReport(activator_id="a1", models={}), followed=followed)


async def test_demand_signals_are_coalesced_one_in_flight_per_model(
        controller: tuple[str, list[str], list[list[str]]]) -> None:
    url, seen, _ = controller
    f = feed(url)
    try:
        # Twenty requests wait at zero within a few milliseconds: one signal goes out.
        for _ in range(20):
            f.signal_demand("demo")
        await until("the demand signal", lambda: seen == ["demo"])
        assert f.demand_coalesced == 19
        # Once it is answered, the next waiting request may signal again.
        await until("the signal answered", lambda: not f.demand_in_flight("demo"))
        f.signal_demand("demo")
        await until("a second signal", lambda: seen == ["demo", "demo"])
    finally:
        await f.close()


async def test_models_waiting_while_signals_are_on_their_way_go_together_in_the_next(
        controller: tuple[str, list[str], list[list[str]]]) -> None:
    url, seen, signals = controller
    f = feed(url)
    try:
        # 500 models come to wait within a few milliseconds; each signal takes 0.3 s.
        names = [f"m{i:03d}" for i in range(500)]
        for name in names:
            f.signal_demand(name)
        await until("every model signalled", lambda: sorted(seen) == names)
        # A signal leaves when the loop next turns, with every model waiting by then:
        # here all of them, in one request (one each, it was 500).
        assert len(seen) == len(names) and f.demand_coalesced == 0
        assert len(signals) <= DEMAND_SENDERS, [len(s) for s in signals]
        await until("every signal answered", lambda: not any(f.demand_in_flight(n) for n in names))
    finally:
        await f.close()
    # Models that come to wait while the senders are all out go together in the next.
    signals.clear()
    seen.clear()
    f = feed(url)
    try:
        for i in range(DEMAND_SENDERS + 50):
            f.signal_demand(f"n{i}")
            await asyncio.sleep(0)  # not a poll: each on its own turn of the loop, so a sender leaves
        await until("every model signalled", lambda: len(seen) == DEMAND_SENDERS + 50)
        assert len(signals) < DEMAND_SENDERS + 50, [len(s) for s in signals]
    finally:
        await f.close()


async def test_a_table_moves_the_long_poll_on_and_wants_the_followed_tables_that_changed() -> None:
    async def on(table: object) -> None:
        pass

    keys = Followed("/v1/keys", bytes, on, held=3)
    catalog = Followed("/v1/catalog", bytes, on, held=2)
    f = feed("http://127.0.0.1:9", {"keys": keys, "catalog": catalog})
    try:
        f.track(RouteTable(epoch="e2", version=7, activators=3, keys_version=3, catalog_version=4, models={}))
        assert (f.version, f.epoch, f.activators, f.keys_version) == (7, "e2", 3, 3)
        # The keys held are the ones listed; the catalog moved on.
        assert (keys.listed, keys.wanted.is_set()) == (3, False)
        assert (catalog.listed, catalog.wanted.is_set()) == (4, True)
    finally:
        await f.close()


@dataclass
class RoutesController:
    """A controller's route feed (the real one) behind ``GET /v1/routes``, recording each
    poll's ``since`` and the answer's base version; ``forged`` is the answer to the next
    poll that the feed answers."""

    url: str
    feed: RouteFeed
    polls: list[tuple[int, int | None]] = field(default_factory=list)
    forged: RouteTable | None = None
    # The catalog behind ``GET /v1/catalog`` (None: none), each fetch's ``since`` and the
    # answer's base version, and the answer to the next fetch.
    catalogs: CatalogFeed | None = None
    fetches: list[tuple[int, int | None]] = field(default_factory=list)
    forged_catalog: Catalog | None = None

    async def publish(self, **replicas: list[str]) -> int:
        await self.feed.publish({m: ModelRoute(served_name=m, replicas=[replica(w) for w in ws])
                                 for m, ws in replicas.items()}, activators=1, keys_version=0,
                                catalog_version=self.catalogs.version if self.catalogs else 0)
        return self.feed.table.version


def replica(wid: str) -> ReplicaRoute:
    return ReplicaRoute(worker_id=wid, url=f"http://{wid}:1", served_model_name="m", assignment_id=f"x-{wid}")


@pytest.fixture
async def routes_controller() -> AsyncIterator[RoutesController]:
    app = FastAPI()
    c = RoutesController("", RouteFeed("e1"))

    @app.get("/v1/routes")
    async def routes(since: int = Query(-1), epoch: str | None = Query(None), wait_s: float = Query(0.0),
                     delta: bool = Query(False)) -> Response:
        table = await c.feed.wait(since, epoch, wait_s, delta=delta)
        if c.forged is not None:
            table, c.forged = c.forged, None
        assert table is not None
        c.polls.append((since, table.base_version))
        return Response(table.body(), media_type="application/json")

    @app.get("/v1/catalog")
    async def catalog(since: int = Query(-1), delta: bool = Query(False)) -> Response:
        assert c.catalogs is not None
        answer = c.catalogs.answer(since, delta=delta)
        if c.forged_catalog is not None:
            answer, c.forged_catalog = c.forged_catalog, None
        c.fetches.append((since, answer.base_version))
        return Response(answer.body(), media_type="application/json")

    @app.post("/v1/reports")
    async def reports() -> Response:
        return Response(status_code=204)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    task = asyncio.create_task(server.serve())
    await until("the controller started", lambda: server.started)
    c.url = f"http://127.0.0.1:{port}"
    try:
        yield c
    finally:
        await c.feed.close()  # answers the long polls
        server.should_exit = True
        server.force_exit = True
        await task


def watcher(url: str, seen: list[RouteTable]) -> ControllerFeed:
    return ControllerFeed(url, "a1", on_table=seen.append,
                          report=lambda: ActivityReport(activator_id="a1", models={}))


async def test_route_updates_come_as_deltas_and_merge_into_the_table_the_controller_holds(
        routes_controller: RoutesController) -> None:
    c = routes_controller
    v1 = await c.publish(a=[], b=[], c=["w1"])
    seen: list[RouteTable] = []
    f = watcher(c.url, seen)
    await f.start()
    try:
        await until("the whole table", lambda: f.table == c.feed.table)
        # One replica ready: only its model on the wire, merged into the whole table.
        v2 = await c.publish(a=["w2"], b=[], c=["w1"])
        await until("the delta taken", lambda: f.table == c.feed.table, detail=lambda: str(c.polls))
        assert c.polls[:2] == [(-1, None), (v1, v1)]
        assert (seen[1].base_version, list(seen[1].models)) == (v1, ["a"])
        # A model removed, another's replica gone.
        await c.publish(a=["w2"], c=[])
        await until("the removal taken", lambda: f.table == c.feed.table)
        assert seen[-1].removed == ["b"] and list(seen[-1].models) == ["c"] and seen[-1].base_version == v2

        # A late joiner asks with no version and gets the whole table at once.
        late_seen: list[RouteTable] = []
        late = watcher(c.url, late_seen)
        await late.start()
        try:
            await until("the late joiner's table", lambda: late.table == c.feed.table)
            assert late_seen[0].base_version is None and sorted(late_seen[0].models) == ["a", "c"]
        finally:
            await late.close()
    finally:
        await f.close()


async def test_a_delta_on_another_version_than_the_one_held_makes_the_next_poll_ask_for_the_whole_table(
        routes_controller: RoutesController) -> None:
    c = routes_controller
    await c.publish(a=[], b=[])
    seen: list[RouteTable] = []
    f = watcher(c.url, seen)
    await f.start()
    try:
        await until("the whole table", lambda: f.table == c.feed.table)
        held = f.version
        c.forged = RouteTable(epoch="e1", version=held + 5, base_version=held + 4, models={})
        await c.publish(a=["w1"], b=[])  # wakes the poll; the forged delta answers it
        await until("the whole table again", lambda: f.table == c.feed.table and len(c.polls) >= 3,
                    detail=lambda: str(c.polls))
        # The forged delta was dropped (the router never saw it); the poll after it had no version.
        assert c.polls[1] == (held, held + 4) and c.polls[2] == (-1, None)
        assert [t.base_version for t in seen] == [None, None]
    finally:
        await f.close()


def models(cfg: ThawConfig, **changes: dict[str, object] | None) -> ThawConfig:
    """``cfg`` with each model named changed (new fields over its own, or a new model's
    whole entry) or removed (None): new objects for those only, as the registry makes them."""
    held = {m.name: m for m in cfg.models}
    for name, fields in changes.items():
        if fields is None:
            held.pop(name)
        else:
            old = held.get(name)
            held[name] = Model.model_validate({**(old.model_dump() if old else {}), "name": name, **fields})
    return cfg.model_copy(update={"models": list(held.values())})


@contextlib.asynccontextmanager
async def catalog_watcher(c: RoutesController, cfg: ThawConfig,
                          seen: list[tuple[Catalog, Catalog]]) -> AsyncIterator[Followed]:
    """``c`` serving version 1 of a catalog of ``cfg``, and a feed following it that has
    taken it whole (each table taken and the answer it came from into ``seen``)."""
    async def on(table: Catalog, answer: Catalog) -> None:
        seen.append((table, answer))

    c.catalogs = CatalogFeed(1, cfg)
    await c.publish()
    followed = Followed("/v1/catalog", Catalog.model_validate_json, on, merge=Catalog.merged)
    f = ControllerFeed(c.url, "a1", on_table=lambda table: None,
                       report=lambda: ActivityReport(activator_id="a1", models={}), followed={"catalog": followed})
    await f.start()
    try:
        await until("the whole catalog", lambda: followed.held == 1)
        yield followed
    finally:
        await f.close()


def by_name(c: Catalog) -> dict[str, Model]:
    return {m.name: m for m in c.models}


async def test_catalog_changes_come_as_deltas_and_merge_into_what_a_whole_fetch_gives(
        routes_controller: RoutesController) -> None:
    c = routes_controller
    cfg = make_config()
    seen: list[tuple[Catalog, Catalog]] = []
    async with catalog_watcher(c, cfg, seen) as followed:
        assert c.catalogs is not None
        catalogs = c.catalogs
        new: dict[str, object] = {"uri": "s3://thaw/models/new", "shape": "cpu-local"}
        steps: list[dict[str, dict[str, object] | None]] = [
            {"new": new}, {"other": {"max_context_tokens": 1024}}, {"other": None},
            {"a": {**new, "uri": "s3://thaw/models/a"}, "b": {**new, "uri": "s3://thaw/models/b"}},
            {"new": None, "a": {"max_context_tokens": 512}}]
        for version, step in enumerate(steps, start=2):
            cfg = models(cfg, **step)
            catalogs.changed(version, cfg)
            await c.publish()
            await until(f"version {version} taken", lambda: followed.held == catalogs.version,
                        detail=lambda: str(c.fetches))
            table, answer = seen[-1]
            assert answer.base_version == version - 1 and sorted([*by_name(answer), *answer.removed]) == sorted(step)
            # Merged, it is what a whole fetch gives.
            whole = catalogs.catalog()
            assert by_name(table) == by_name(whole) and table.tenants == whole.tenants and table.version == version
        assert c.fetches[0] == (-1, None) and all(since == base for since, base in c.fetches[1:])


async def test_a_catalog_delta_on_another_version_than_the_one_held_makes_the_next_fetch_whole(
        routes_controller: RoutesController) -> None:
    c = routes_controller
    cfg = make_config()
    seen: list[tuple[Catalog, Catalog]] = []
    async with catalog_watcher(c, cfg, seen) as followed:
        assert c.catalogs is not None
        c.forged_catalog = Catalog(version=3, base_version=2, models=[], tenants=[])
        c.catalogs.changed(2, models(cfg, other=None))
        await c.publish()
        await until("the whole catalog again", lambda: followed.held == 2, detail=lambda: str(c.fetches))
        # The forged delta was dropped (``on`` never saw it); the fetch after it asked for the whole.
        assert c.fetches == [(-1, None), (1, 2), (-1, None)]
        assert [(t.version, a.base_version) for t, a in seen] == [(1, None), (2, None)]
        assert sorted(by_name(seen[-1][0])) == ["demo"]
