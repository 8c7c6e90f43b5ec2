"""The activator's batch worker: how a line's run ends decides what the controller is
told. A line whose standby the controller took back for an online cold start goes back
uncounted (a cut, not a failure); one whose replica failed otherwise counts a failure;
one cut for an online request on a shared replica goes back uncounted; an answer is
billed only when the controller keeps it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import activator.batch.worker as batch_worker_module
from activator.batch.worker import BatchWorker
from activator.metrics import ActivatorMetrics
from activator.routing.replicas import Replica
from activator.routing.router import Router
from tests.waiting import until
from thaw.config import BatchConfig, ThawConfig, parse_config
from thaw.wire import LeasedLine, ModelRoute, ReplicaRoute, RouteTable

CFG = parse_config({
    "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
    "models": [{"name": name, "uri": f"s3://thaw/{name}", "shape": "cpu"} for name in ("bulk", "solo")],
})


class Controller:
    """The controller's batch-line routes as the worker calls them: every post kept;
    ``kept`` answers whether a result is the line's first."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.kept = True

    async def post_json(self, path: str, body: str) -> httpx.Response:
        self.posts.append((path, json.loads(body)))
        if path.endswith("/result"):
            return httpx.Response(200, json={"kept": self.kept})
        return httpx.Response(200, json={})

    def released(self) -> list[str | None]:
        return [body.get("failure") for path, body in self.posts if path.endswith("/release")]


class Service:
    """The completion service's batch side: each run waits until the test ends it."""

    def __init__(self, cfg: ThawConfig) -> None:
        self.cfg = cfg
        self.metrics = ActivatorMetrics(CollectorRegistry())
        self.started = asyncio.Event()
        self.outcome: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.recorded: list[str | None] = []

    async def run_batch_line(self, tenant: str, model: Any, kind: Any, body: dict[str, Any], replica: Replica,
                             ctx: Any) -> tuple[int, bytes]:
        self.started.set()
        return await self.outcome

    async def record(self, ctx: Any, code: str | None) -> None:
        self.recorded.append(code)


def table(version: int, **models: list[ReplicaRoute]) -> RouteTable:
    return RouteTable(epoch="e", version=version,
                      models={name: ModelRoute(served_name=name, replicas=reps) for name, reps in models.items()})


def lent(worker: str = "w1", assignment: str = "bulk-b-1", *, batch: bool = True) -> ReplicaRoute:
    return ReplicaRoute(worker_id=worker, url=f"http://{worker}:8000", served_model_name="bulk",
                        assignment_id=assignment, batch=batch)


LINE = LeasedLine(batch_id="batch_1", tenant="acme", line=7, custom_id="r7", model="bulk",
                  endpoint="/v1/chat/completions", body={"model": "bulk", "messages": []}, lease_until=1e12)


@pytest.fixture
async def world(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[BatchWorker, Service, Controller]]:
    monkeypatch.setattr(batch_worker_module, "PREEMPTED_WAIT_S", 0.5)
    routes = Router(CFG.models, "http://127.0.0.1:9", "act-1")
    service, controller = Service(CFG), Controller()
    worker = BatchWorker(service, routes, controller, "act-1", BatchConfig())  # type: ignore[arg-type]
    try:
        yield worker, service, controller
    finally:
        await worker.close()
        await routes.close()


def count(service: Service, outcome: str) -> float:
    return service.metrics.registry.get_sample_value(
        "thaw_batch_lines_total", {"model": "bulk", "outcome": outcome}) or 0.0


async def running_line(worker: BatchWorker, service: Service, replica: ReplicaRoute) -> asyncio.Task[None]:
    """LINE running on ``replica`` (bulk's one replica), leased as the worker's step
    leases it: its task, once the service has the request."""
    worker.routes.apply(table(1, bulk=[replica], solo=[]))
    run = asyncio.create_task(worker._run(LINE))
    worker.running.setdefault("bulk", {})[(LINE.batch_id, LINE.line)] = run
    await asyncio.wait_for(service.started.wait(), 5)
    return run


async def test_a_line_whose_standby_is_taken_back_goes_back_uncounted(
        world: tuple[BatchWorker, Service, Controller]) -> None:
    worker, service, controller = world
    run = await running_line(worker, service, lent())
    # The controller assigns the lent standby to solo (an online cold start): the batch
    # engine dies under the line, and the table says the worker serves solo now.
    worker.routes.apply(table(2, bulk=[], solo=[ReplicaRoute(
        worker_id="w1", url="http://w1:8001", served_model_name="solo", assignment_id="solo-1")]))
    service.outcome.set_exception(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    await asyncio.wait_for(run, 5)
    assert controller.released() == [None]
    assert count(service, "preempted") == 1 and count(service, "failed") == 0
    assert service.recorded == [] and worker.running.get("bulk", {}) == {}


async def test_a_line_whose_replica_fails_otherwise_counts_a_failure(
        world: tuple[BatchWorker, Service, Controller]) -> None:
    worker, service, controller = world
    run = await running_line(worker, service, lent())
    # The worker still serves bulk under the same assignment: not taken back.
    service.outcome.set_exception(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    await asyncio.wait_for(run, 5)
    [failure] = controller.released()
    assert failure is not None and "RemoteProtocolError" in failure
    assert count(service, "failed") == 1 and count(service, "preempted") == 0


async def test_a_line_cut_for_an_online_request_goes_back_uncounted(
        world: tuple[BatchWorker, Service, Controller]) -> None:
    worker, service, controller = world
    run = await running_line(worker, service, lent("w2", "bulk-1", batch=False))
    assert worker.routes.replicas("bulk").usable[0].outstanding == 1
    worker.yield_to_online("bulk")
    await asyncio.wait_for(run, 5)
    assert controller.released() == [None] and count(service, "yielded") == 1
    # Its slot is free again, for the online request it was cut for.
    assert worker.routes.replicas("bulk").usable[0].outstanding == 0
    await until("the line forgotten", lambda: worker.running.get("bulk", {}) == {})


@pytest.mark.parametrize("kept", [True, False])
async def test_an_answer_is_billed_only_when_the_controller_keeps_it(
        world: tuple[BatchWorker, Service, Controller], kept: bool) -> None:
    worker, service, controller = world
    controller.kept = kept
    run = await running_line(worker, service, lent())
    service.outcome.set_result((200, json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()))
    await asyncio.wait_for(run, 5)
    [(path, body)] = controller.posts
    assert path == "/v1/batch-lines/batch_1/7/result" and body["response"]["status_code"] == 200
    assert service.recorded == ([None] if kept else [])
    assert count(service, "answered" if kept else "answered_twice") == 1
