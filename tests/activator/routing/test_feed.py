"""The activator's link to the controller: demand signals, and what a route table says
of the versions it follows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from activator.routing.feed import ControllerFeed, Followed
from tests.waiting import until
from thaw.embedded_store import free_port
from thaw.wire import ActivityReport, RouteTable


@pytest.fixture
async def controller() -> AsyncIterator[tuple[str, list[str]]]:
    """A controller that takes 0.3 s to answer a demand signal, and records them."""
    seen: list[str] = []
    app = FastAPI()

    @app.post("/v1/demand")
    async def demand(request: Request) -> Response:
        seen.append((await request.json())["model"])
        await asyncio.sleep(0.3)
        return Response(status_code=202)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    task = asyncio.create_task(server.serve())
    await until("the controller started", lambda: server.started)
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.should_exit = True
        server.force_exit = True
        await task


def feed(url: str, followed: dict[str, Followed] | None = None) -> ControllerFeed:
    return ControllerFeed(url, "a1", on_table=lambda table: None,
                          report=lambda: ActivityReport(activator_id="a1", models={}), followed=followed)


async def test_demand_signals_are_coalesced_one_in_flight_per_model(controller: tuple[str, list[str]]) -> None:
    url, seen = controller
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
