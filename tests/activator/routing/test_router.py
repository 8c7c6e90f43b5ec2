"""The router: a request's slot, hot or through the cold and fair queues; ejection;
batch room; what the service, the API and the controller read of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from activator.errors import NotFound, ServiceUnavailable, TooManyRequests
from activator.routing.router import CAPACITY_RETRY_AFTER_S, Router, public_failure
from tests.waiting import until
from thaw.config import parse_config
from thaw.wire import ModelRoute, ReplicaRoute, RouteTable

CFG = parse_config({
    "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
    "models": [{"name": "demo", "uri": "s3://thaw/demo", "shape": "cpu",
                "autoscaling": {"activation_timeout_s": 2}}],
})
MODEL = CFG.models[0]


def route(i: int = 1) -> ReplicaRoute:
    return ReplicaRoute(worker_id=f"w{i}", url=f"http://127.0.0.1:{i}", served_model_name="demo",
                        assignment_id=f"a-{i}")


def table(version: int, *replicas: ReplicaRoute, **kw: object) -> RouteTable:
    return RouteTable(epoch="e", version=version,
                      models={"demo": ModelRoute(served_name="demo", replicas=list(replicas), **kw)})  # type: ignore[arg-type]


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    r = Router(CFG.models, "http://127.0.0.1:9", "a1", ejection_s=1.0)
    r.feed.signal_demand = lambda model: None  # type: ignore[method-assign]  # no controller here
    yield r
    await r.close()


async def test_a_route_table_taken_in_during_a_request_does_not_leak_its_slot(router: Router) -> None:
    router.apply(table(1, route()))
    got = await router.acquire(MODEL, router.clock())
    assert got.replica.outstanding == 1 and not got.cold
    router.apply(table(2, route()))  # a new table while the request runs: a new Replica object
    live = router.replicas("demo").usable[0]
    assert live is not got.replica and live.outstanding == 1
    router.release("demo", got.replica)
    assert live.outstanding == 0


async def test_an_ejected_replica_comes_back_after_its_ejection_and_wakes_the_waiting(router: Router) -> None:
    """Its only replica ejected, a model's requests wait in the cold queue; the ejection
    ends on its own (the controller never dropped the replica), and they get it."""
    router.apply(table(1, route()))
    router.eject("demo", route().url)
    assert router.status("demo").state == "cold"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    got = await asyncio.wait_for(router.acquire(MODEL, router.clock()), 5)
    assert got.replica.url == route().url and got.cold
    assert loop.time() - t0 >= 0.9
    # Ejected again before the first ejection's timer: that timer does not end the second.
    router.eject("demo", route().url)
    await asyncio.sleep(0.6)
    router.eject("demo", route().url)
    await asyncio.sleep(0.6)  # quiet: past the first timer, 0.4 s before the second
    assert router.replicas("demo").usable == []
    await until("the replica readmitted when the second ejection ends", lambda: router.replicas("demo").usable, 5)
    assert [r.url for r in router.replicas("demo").usable] == [route().url]


@pytest.mark.parametrize(("kind", "reason"), [
    ("weights_integrity", "its weights do not match their manifest (sha256, size or format)"),
    ("store", "its weights could not be read from the object store"),
    ("memory", "it does not fit in the worker's memory"),
    ("engine", "its engine did not start"),
    ("capacity", "its pool has no instance free"),
    (None, "its engine did not start"),
])
def test_a_failed_load_is_told_to_callers_by_its_kind_never_its_details(kind: str | None, reason: str) -> None:
    assert public_failure(kind) == reason


async def test_a_new_failure_fails_the_cold_queue_with_its_kind_and_backoff(router: Router) -> None:
    router.apply(table(1, loading=1))
    waiting = asyncio.create_task(router.acquire(MODEL, router.clock()))
    await until("the request waiting", lambda: router.status("demo").cold_queue == 1, 2)
    router.apply(table(2, failures=1, error="s3://secret/path: 403", failure_kind="store",
                       backoff_until=router.clock() + 30))
    with pytest.raises(ServiceUnavailable) as failed:
        await waiting
    assert "could not be read from the object store" in failed.value.message
    assert "secret" not in failed.value.message
    st = router.status("demo")
    assert (st.state, st.failure_kind, st.cold_queue) == ("failed", "store", 0)
    # While it backs off, a new request is told at once.
    with pytest.raises(ServiceUnavailable):
        await router.acquire(MODEL, router.clock())


async def test_a_full_pool_refuses_the_waiting_and_new_requests_at_once(router: Router) -> None:
    """The controller says the model's pool can give it no instance (failure kind
    "capacity", by its cause): its waiting requests get 503 with Retry-After at once,
    and so does each new one while that holds; then requests wait again."""
    full = "pool cpu is at max_instances 1 and every replica is busy"
    router.apply(table(1))
    waiting = asyncio.create_task(router.acquire(MODEL, router.clock()))
    await until("the request waiting", lambda: router.status("demo").cold_queue == 1, 2)
    router.apply(table(2, failure_kind="capacity", error=full))
    with pytest.raises(ServiceUnavailable) as refused:
        await asyncio.wait_for(waiting, 1)  # not after the 2 s activation timeout
    e = refused.value
    assert e.message == f"model 'demo' cannot start now: {full}; retry later"
    assert (e.status, e.code, e.retry_after_s) == (503, "pool_at_capacity", CAPACITY_RETRY_AFTER_S)
    assert router.status("demo").cold_queue == 0
    with pytest.raises(ServiceUnavailable) as again:
        await asyncio.wait_for(router.acquire(MODEL, router.clock()), 1)
    assert again.value.message == e.message
    # Cleared (a replica placed, or its demand gone): a request waits for the replica.
    router.apply(table(3, loading=1))
    waiting = asyncio.create_task(router.acquire(MODEL, router.clock()))
    await until("the request waiting", lambda: router.status("demo").cold_queue == 1, 2)
    router.apply(table(4, route()))
    assert (await asyncio.wait_for(waiting, 1)).cold


async def test_a_full_cold_queue_refuses_and_the_deadline_ends_a_wait(router: Router) -> None:
    model = MODEL.model_copy(update={"autoscaling": MODEL.autoscaling.model_copy(
        update={"max_queue_length": 1, "activation_timeout_s": 0.2})})
    first = asyncio.create_task(router.acquire(model, router.clock()))
    await asyncio.sleep(0)
    with pytest.raises(TooManyRequests):
        await router.acquire(model, router.clock())
    with pytest.raises(ServiceUnavailable):
        await first


async def test_a_removed_model_fails_its_waiting_requests(router: Router) -> None:
    waiting = asyncio.create_task(router.acquire(MODEL, router.clock()))
    await asyncio.sleep(0)
    router.set_models([])
    with pytest.raises(NotFound):
        await waiting
    assert router.model_names() == ["demo"]  # its requests in flight still end here


async def test_the_service_reports_a_requests_life(router: Router) -> None:
    assert router.report_body().models == {}  # a model never asked for here is left out
    assert router.arrive("demo", now=1.0)  # no replica: part of a cold start
    router.apply(table(1, route()))
    assert not router.arrive("demo", now=2.0)
    got = await router.acquire(MODEL, router.clock())
    router.started("demo")
    router.note_ttft("demo", 0.25)
    report = router.report_body().models["demo"]
    assert (report.arrivals, report.in_flight, report.ttft_s) == (2, 1, [0.25])
    router.ended("demo", now=3.0, replica=got.replica)
    report = router.report_body().models["demo"]
    assert (report.in_flight, report.last_request_at, got.replica.outstanding) == (0, 3.0, 0)


async def test_batch_takes_only_room_online_traffic_leaves_and_yields_it_at_once(router: Router) -> None:
    routes = [route(1), route(2)]
    router.apply(table(1, *routes))
    cap = MODEL.autoscaling.max_concurrency_per_replica
    # Half the slots of both replicas, less what batch runs already.
    assert router.batch_room("demo", 0.5, running=0) == cap
    assert router.batch_room("demo", 0.5, running=cap - 1) == 1
    assert router.batch_room("demo", 0.0, running=0) == 0
    # A replica placed for batch work lends batch all its slots.
    router.apply(table(2, routes[0].model_copy(update={"batch": True}), routes[1]))
    assert router.batch_room("demo", 0.5, running=0) == cap + cap // 2
    router.apply(table(3, *routes))
    batch = [router.take_batch_slot("demo") for _ in range(cap)]
    assert all(r is not None for r in batch)
    # Online takes the rest; then one more online request must wait: batch is cut.
    online = [await router.acquire(MODEL, router.clock(), tenant="t") for _ in range(cap)]
    cut: list[str] = []

    def yield_batch(name: str) -> None:
        cut.append(name)
        rep = batch.pop()
        assert rep is not None
        router.release(name, rep)  # what the cut batch request does

    router.yield_batch_with(yield_batch)
    waiting = await asyncio.wait_for(router.acquire(MODEL, router.clock(), tenant="t"), 2)
    assert cut == ["demo"] and waiting.replica is not None
    # While an online request waits, batch gets no room and no slot.
    router.yield_batch_with(lambda name: None)
    blocked = asyncio.create_task(router.acquire(MODEL, router.clock(), tenant="u"))
    await until("the online request waiting", lambda: router.status("demo").fair_queue == 1, 2)
    assert router.batch_room("demo", 1.0, running=0) == 0 and router.take_batch_slot("demo") is None
    assert len(online) == cap
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)


async def test_a_standby_lent_to_batch_is_taken_back_when_its_worker_serves_another(router: Router) -> None:
    router.apply(table(1, route(1)))
    lent = router.take_batch_slot("demo")
    assert lent is not None and not router.taken_back(lent)
    router.apply(table(2, route(1).model_copy(update={"assignment_id": "a-online"})))
    assert router.taken_back(lent)


async def test_a_delta_brings_the_router_what_the_whole_table_would(router: Router) -> None:
    """The feed merges a delta into the table it holds and hands the router the delta:
    its models get what the whole table would have given them, a request in flight
    keeps its slot, and a model the delta does not name is left as it was."""
    whole = RouteTable(epoch="e", version=1, models={"demo": ModelRoute(served_name="demo", replicas=[route(1)]),
                                                    "gone": ModelRoute(served_name="gone")})
    assert router.feed.take(whole)
    got = await router.acquire(MODEL, router.clock())
    delta = RouteTable(epoch="e", version=2, base_version=1, removed=["gone"],
                       models={"demo": ModelRoute(served_name="demo", replicas=[route(1), route(2)])})
    assert router.feed.take(delta)
    assert [r.url for r in router.replicas("demo").usable] == [route(1).url, route(2).url]
    assert router.replicas("demo").usable[0].outstanding == 1
    assert router.feed.table == RouteTable(epoch="e", version=2, models=delta.models)
    assert (router.feed.version, router.feed.epoch) == (2, "e")
    router.release("demo", got.replica)
    # A delta made from a version it does not hold: not taken, the routes stay.
    assert not router.feed.take(delta.model_copy(update={"version": 4, "base_version": 3, "models": {}}))
    assert (router.feed.version, len(router.replicas("demo").usable)) == (2, 2)


async def test_a_model_whose_route_came_before_its_catalog_gets_it_from_the_table_held(router: Router) -> None:
    """A deploy moves the catalog's version and lists the new model's route in one table;
    the router has no routes for it until the catalog arrives, and a delta will not name
    it again until it changes: the router takes its route from the table the feed holds."""
    second = MODEL.model_copy(update={"name": "second"})
    router.feed.take(RouteTable(epoch="e", version=1, models={
        "demo": ModelRoute(served_name="demo"), "second": ModelRoute(served_name="second", replicas=[route(7)])}))
    assert "second" not in router.model_names()
    router.set_models([MODEL, second])
    assert [r.url for r in router.replicas("second").usable] == [route(7).url]
