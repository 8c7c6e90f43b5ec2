"""A worker on batch work, with a fake engine host: it keeps a spare engine host imported
beside the batch engine, and an assignment that is not for batch takes it at once (the
batch engine killed, the spare in its place); batch work never preempts anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.worker.fakes import World, agent_client, assign_body, wait_state


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
async def client(world: World, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with agent_client(world, tmp_path) as c:
        yield c


async def test_an_online_assignment_takes_a_worker_from_batch_work_on_its_spare_host(
        client: httpx.AsyncClient, world: World) -> None:
    await wait_state(client, "standby")
    r = await client.post("/assign", json=assign_body(assignment_id="b1", model="bulk", batch=True))
    assert r.status_code == 202 and r.json()["batch"] is True
    body = await wait_state(client, "ready")
    assert body["model"] == "bulk" and body["batch"] is True
    # The batch engine runs on the first host; a spare was started and imported beside it.
    assert len(world.hosts) == 2 and world.hosts[0].launched and not world.hosts[1].launched
    batch_host, spare = world.hosts
    # Another batch assignment does not take it.
    r = await client.post("/assign", json=assign_body(assignment_id="b2", model="other", batch=True))
    assert r.status_code == 409
    # An online one does: the batch engine is killed (no drain), the spare takes the launch.
    r = await client.post("/assign", json=assign_body(assignment_id="o1", model="demo"))
    assert r.status_code == 202
    assert r.json()["assignment_id"] == "o1" and r.json()["batch"] is False
    assert batch_host.stops == [0.0]
    body = await wait_state(client, "ready")
    assert body["model"] == "demo" and body["assignment_id"] == "o1"
    assert spare.launched and len(world.hosts) == 2  # no third host: nothing waited for imports
    # Online work is never preempted.
    r = await client.post("/assign", json=assign_body(assignment_id="o2", model="other"))
    assert r.status_code == 409
    metrics = (await client.get("/metrics")).text
    assert "thaw_worker_batch_preemption_seconds_count 1.0" in metrics


async def test_a_released_batch_assignment_stands_by_on_its_spare(client: httpx.AsyncClient, world: World) -> None:
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body(assignment_id="b1", model="bulk", batch=True))
    await wait_state(client, "ready")
    r = await client.post("/release", json={"assignment_id": "b1", "drain_timeout_s": 1})
    assert r.status_code == 202
    body = await wait_state(client, "standby")
    assert body["model"] is None and body["batch"] is False
    assert len(world.hosts) == 2 and world.hosts[0].stops  # the spare is the standby's host now
    # A batch assignment that is still loading is preempted as well.
    world.on_launch = "hang"
    await client.post("/assign", json=assign_body(assignment_id="b2", model="bulk", batch=True))
    await wait_state(client, "loading")
    world.on_launch = "ok"
    r = await client.post("/assign", json=assign_body(assignment_id="o1", model="demo"))
    assert r.status_code == 202
    assert (await wait_state(client, "ready"))["assignment_id"] == "o1"
