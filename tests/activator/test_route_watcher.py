"""The route watcher's traffic reports and demand signals to the controller."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from activator.route_watcher import Replica, RouteWatcher, cold_start_tier, public_failure
from tests.waiting import until
from thaw.config import parse_config
from thaw.embedded_store import free_port

CFG = parse_config({
    "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
    "models": [{"name": "demo", "uri": "s3://thaw/demo", "shape": "cpu",
                "autoscaling": {"activation_timeout_s": 2}}],
})


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

    @app.get("/v1/routes")
    async def routes() -> Response:
        await asyncio.sleep(30)  # a long poll that never answers in these tests
        return Response(status_code=503)

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


async def test_demand_signals_are_coalesced_one_in_flight_per_model(controller: tuple[str, list[str]]) -> None:
    url, seen = controller
    w = RouteWatcher(CFG.models, url, "a1")
    try:
        # Twenty requests wait at zero within a few milliseconds: one signal goes out.
        model = CFG.models[0]
        waits = [asyncio.create_task(w._wait_cold(model, asyncio.get_running_loop().time())) for _ in range(20)]
        await until("the demand signal", lambda: seen == ["demo"])
        assert w.demand_coalesced == 19
        # Once it is answered, the next waiting request may signal again.
        await until("the signal answered", lambda: "demo" not in w._demand_in_flight)
        w.signal_demand("demo")
        await until("a second signal", lambda: seen == ["demo", "demo"])
        for t in waits:
            t.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    finally:
        await w.close()


async def test_reports_carry_arrival_counters_and_take_ttft_samples() -> None:
    w = RouteWatcher(CFG.models, f"http://127.0.0.1:{free_port()}", "a1")
    st = w.routes["demo"]
    st.arrivals = 5
    for t in (0.1, 0.2):
        st.note_ttft(t)
    first = w.report_body().models["demo"]
    assert (first.arrivals, first.ttft_s) == (5, [0.1, 0.2])
    # The counter stays (the controller takes differences); the samples were taken.
    second = w.report_body().models["demo"]
    assert (second.arrivals, second.ttft_s) == (5, [])
    for _ in range(1000):
        st.note_ttft(0.5)
    assert len(w.report_body().models["demo"].ttft_s) == 256  # a bounded sample
    await w.close()


def test_cold_start_tier_says_where_the_replica_got_its_model() -> None:
    def rep(**kw: Any) -> Replica:
        return Replica("w1", "http://x", "m", "a1", {"woken": kw.pop("woken", None)}, **kw)

    assert cold_start_tier(100.0, rep(load_tier="host", worker_started_at=50.0)) == "host"
    assert cold_start_tier(100.0, rep(load_tier="disk", worker_started_at=50.0)) == "disk"
    assert cold_start_tier(100.0, rep(load_tier="s3")) == "s3"
    assert cold_start_tier(100.0, rep()) == "s3"  # a loader that reports nothing read the store
    # The worker's agent started after the request began waiting: launched for it.
    assert cold_start_tier(100.0, rep(load_tier="s3", worker_started_at=101.0)) == "launch"
    assert cold_start_tier(100.0, rep(woken=120.0, load_tier="asleep")) == "asleep"
    # Weights swapped into an engine built before, from wherever they were read.
    assert cold_start_tier(100.0, rep(load_tier="host", load_swap=True, worker_started_at=50.0)) == "swap"
    assert cold_start_tier(100.0, rep(load_tier="s3", load_swap=True)) == "swap"
    # An engine packed beside others: its worker was serving, so never a launch.
    assert cold_start_tier(100.0, rep(load_tier="s3", packed=True, worker_started_at=101.0)) == "packed"
    # An adapter into a base serving before the request; a base brought up for it counts
    # where the base came from.
    assert cold_start_tier(100.0, rep(adapter=True, base_ready_at=90.0, load_tier="host")) == "adapter"
    assert cold_start_tier(100.0, rep(adapter=True, base_ready_at=110.0, load_tier="host",
                                      worker_started_at=50.0)) == "host"


async def test_a_route_table_taken_in_during_a_request_does_not_leak_its_slot() -> None:
    from thaw.wire import ModelRoute, ReplicaRoute, RouteTable

    w = RouteWatcher(CFG.models, "http://127.0.0.1:9", "a1")
    try:
        route = ReplicaRoute(worker_id="w1", url="http://127.0.0.1:1", served_model_name="demo", assignment_id="a-1")

        def table(version: int) -> RouteTable:
            return RouteTable(epoch="e", version=version, models={"demo": ModelRoute(served_name="demo",
                                                                                      replicas=[route])})

        w.apply(table(1))
        model = CFG.models[0]
        got = await w.acquire(model, w.clock())
        assert got.replica.outstanding == 1
        w.apply(table(2))  # a new table while the request runs: a new Replica object
        live = w.routes["demo"].replicas[0]
        assert live is not got.replica and live.outstanding == 1
        w.release("demo", got.replica)
        assert live.outstanding == 0
    finally:
        await w.close()


async def test_an_ejected_replica_comes_back_after_its_ejection_and_wakes_the_waiting() -> None:
    """Its only replica ejected, a model's requests wait in the cold queue; the ejection
    ends on its own (the controller never dropped the replica), and they get it."""
    from thaw.wire import ModelRoute, ReplicaRoute, RouteTable

    w = RouteWatcher(CFG.models, "http://127.0.0.1:9", "a1", ejection_s=1.0)
    try:
        route = ReplicaRoute(worker_id="w1", url="http://127.0.0.1:1", served_model_name="demo", assignment_id="a-1")
        w.apply(RouteTable(epoch="e", version=1, models={"demo": ModelRoute(served_name="demo", replicas=[route])}))
        w.eject("demo", route.url)
        assert w.state_of("demo") == "cold"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await asyncio.wait_for(w.acquire(CFG.models[0], w.clock()), 5)
        assert got.replica.url == route.url and got.cold
        assert loop.time() - t0 >= 0.9
        # Ejected again before the first ejection's timer: that timer does not end the second.
        w.eject("demo", route.url)
        await asyncio.sleep(0.6)
        w.eject("demo", route.url)
        await asyncio.sleep(0.6)  # quiet: past the first timer, 0.4 s before the second
        assert w.routes["demo"].replicas == []
        await until("the replica readmitted when the second ejection ends", lambda: w.routes["demo"].replicas, 5)
        assert [r.url for r in w.routes["demo"].replicas] == [route.url]
    finally:
        await w.close()


@pytest.mark.parametrize(("kind", "reason"), [
    ("weights_integrity", "its weights do not match their manifest (sha256, size or format)"),
    ("store", "its weights could not be read from the object store"),
    ("memory", "it does not fit in the worker's memory"),
    ("engine", "its engine did not start"),
    (None, "its engine did not start"),
])
def test_a_failed_load_is_told_to_callers_by_its_kind_never_its_details(kind: str | None, reason: str) -> None:
    assert public_failure(kind) == reason


async def test_batch_takes_only_room_online_traffic_leaves_and_yields_it_at_once() -> None:
    from thaw.wire import ModelRoute, ReplicaRoute, RouteTable

    w = RouteWatcher(CFG.models, "http://127.0.0.1:9", "a1")
    cut: list[str] = []
    try:
        routes = [ReplicaRoute(worker_id=f"w{i}", url=f"http://127.0.0.1:{i}", served_model_name="demo",
                               assignment_id=f"a-{i}") for i in (1, 2)]
        w.apply(RouteTable(epoch="e", version=1, models={"demo": ModelRoute(served_name="demo", replicas=routes)}))
        model = CFG.models[0]
        cap = model.autoscaling.max_concurrency_per_replica
        # Half the slots of both replicas, less what batch runs already.
        assert w.batch_room("demo", 0.5, running=0) == cap
        assert w.batch_room("demo", 0.5, running=cap - 1) == 1
        assert w.batch_room("demo", 0.0, running=0) == 0
        # A replica placed for batch work lends batch all its slots.
        lent = [routes[0].model_copy(update={"batch": True}), routes[1]]
        w.apply(RouteTable(epoch="e", version=2, models={"demo": ModelRoute(served_name="demo", replicas=lent)}))
        assert w.batch_room("demo", 0.5, running=0) == cap + cap // 2
        w.apply(RouteTable(epoch="e", version=3, models={"demo": ModelRoute(served_name="demo", replicas=routes)}))
        batch = [w.take_batch_slot("demo") for _ in range(cap)]
        assert all(r is not None for r in batch)
        # Online takes the rest; then one more online request must wait: batch is cut.
        online = [await w.acquire(model, w.clock(), tenant="t") for _ in range(cap)]

        def yield_batch(name: str) -> None:
            cut.append(name)
            rep = batch.pop()
            assert rep is not None
            w.release(name, rep)  # what the cut batch request does

        w.yield_batch = yield_batch
        waiting = await asyncio.wait_for(w.acquire(model, w.clock(), tenant="t"), 2)
        assert cut == ["demo"] and waiting.replica is not None
        # While an online request waits, batch gets no room and no slot.
        w.routes["demo"].fair["t"] = deque([(asyncio.get_running_loop().create_future(), None)])
        assert w.batch_room("demo", 1.0, running=0) == 0 and w.take_batch_slot("demo") is None
        assert len(online) == cap
    finally:
        w.routes["demo"].fair.clear()
        await w.close()
