"""The agent's control API and state machine, with a fake engine host and engine.

Fast: no process, no vLLM. The real thing is in test_agent.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.waiting import until
from tests.worker.fakes import (
    SECRET,
    TOKEN,
    World,
    agent_client,
    assign_body,
    ready,
    wait_state,
)
from thaw.objstore import S3Endpoint


@pytest.fixture
def world(request: pytest.FixtureRequest) -> World:
    # A test can start from another world: @pytest.mark.parametrize("world", [...], indirect=True)
    return getattr(request, "param", None) or World()


@pytest.fixture
async def client(world: World, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with agent_client(world, tmp_path) as c:
        yield c
    # Shutdown stopped the engine host.
    assert world.hosts and all(h.returncode is not None for h in world.hosts)


@pytest.mark.parametrize("world", [World(import_on_spawn=False)], indirect=True)
async def test_starting_until_the_engine_host_imported(world: World, client: httpx.AsyncClient) -> None:
    await asyncio.sleep(0.05)
    body = (await client.get("/state")).json()
    assert body["state"] == "starting"
    assert body["worker_id"] == "w1" and body["shape"] == "cpu-small"
    assert body["engine_url"] is None and body["model"] is None and body["snapshot"] is None
    r = await client.post("/assign", json=assign_body())
    assert r.status_code == 409 and r.json()["state"] == "starting"
    world.hosts[0].emit("imported")
    await wait_state(client, "standby")


async def test_every_endpoint_but_healthz_needs_the_cluster_token(client: httpx.AsyncClient) -> None:
    await wait_state(client, "standby")
    for method, path in (("GET", "/state"), ("GET", "/metrics"), ("POST", "/assign"), ("POST", "/release"),
                         ("POST", "/sleep")):
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": TOKEN}):
            r = await client.request(method, path, headers=headers, json=assign_body())
            assert r.status_code == 401, (method, path, headers)
            assert "cluster token" in r.json()["error"] and TOKEN not in r.text
    assert (await client.get("/healthz", headers={"Authorization": ""})).status_code == 200
    # Nothing was assigned by the refused calls.
    assert (await client.get("/state")).json()["state"] == "standby"


async def test_healthz_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"ok": True}
    await wait_state(client, "standby")
    text = (await client.get("/metrics")).text
    assert 'thaw_worker_state{state="standby"} 1.0' in text
    assert 'thaw_worker_state{state="starting"} 0.0' in text
    assert "thaw_worker_engine_start_seconds_count 0.0" in text


# -- assign ------------------------------------------------------------------------------


async def test_assign_loads_then_ready(world: World, client: httpx.AsyncClient) -> None:
    await wait_state(client, "standby")
    t0 = time.time()
    r = await client.post("/assign", json=assign_body())
    assert r.status_code == 202
    assert r.json()["state"] == "loading" and r.json()["assignment_id"] == "a1"
    body = await wait_state(client, "ready")
    assert body["model"] == "demo" and body["served_model_name"] == "demo-chat"
    p = body["phases"]
    assert t0 <= p["assigned"] <= p["snapshot_restored"] <= p["weights_loaded"] <= p["engine_ready"]
    assert body["error"] is None and body["in_flight"] == 0
    cmd = world.hosts[0].launches[0]
    assert body["engine_url"] == f"http://127.0.0.1:{cmd.port}"
    assert cmd.uri == "s3://thaw/models/demo" and cmd.served_model_name == "demo-chat"
    assert cmd.max_model_len == 512 and cmd.engine.enforce_eager
    assert cmd.env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert cmd.env["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    # The store's secret never leaves through the API.
    assert SECRET not in (await client.get("/state")).text
    assert "thaw_worker_engine_start_seconds_count 1.0" in (await client.get("/metrics")).text


async def test_assign_conflicts_unless_standby(client: httpx.AsyncClient) -> None:
    await ready(client)
    r = await client.post("/assign", json=assign_body(assignment_id="a2"))
    assert r.status_code == 409
    assert r.json()["state"] == "ready" and "ready" in r.json()["error"]
    # A retried request for the current assignment is not a conflict.
    r = await client.post("/assign", json=assign_body())
    assert r.status_code == 202 and r.json()["state"] == "ready"


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        ({"uri": "http://not-s3/x"}, "uri"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"engine": {"enforce_eagre": True}}, "engine.enforce_eagre"),
        # The store's credentials come from the worker's environment, never the wire.
        ({"store": {"access_key": "AK", "secret_key": "x"}}, "store"),
        ({"assignment_id": ""}, "assignment_id"),
        ({"surprise": 1}, "surprise"),
    ],
)
async def test_assign_malformed_body_is_422_naming_the_field(
    client: httpx.AsyncClient, change: dict[str, Any], field_name: str
) -> None:
    await wait_state(client, "standby")
    r = await client.post("/assign", json=assign_body(**change))
    assert r.status_code == 422
    assert field_name in r.json()["error"]
    assert (await client.get("/state")).json()["state"] == "standby"


async def test_assign_without_a_body_is_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/assign", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "error" in r.json()


# -- failures --------------------------------------------------------------------------


async def test_no_manifest_fails_at_once_and_keeps_the_engine_host(world: World, client: httpx.AsyncClient) -> None:
    world.manifest = lambda store, uri: None
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body(uri="s3://thaw/models/missing"))
    body = await wait_state(client, "failed")
    assert body["error"].startswith("no model at s3://thaw/models/missing")
    assert "thaw-manifest.json" in body["error"]
    assert body["assignment_id"] == "a1"
    # Nothing was launched: the same engine host stands by again after the release.
    assert world.hosts[0].launches == []
    r = await client.post("/release", json={})
    assert r.status_code == 202
    body = await wait_state(client, "standby")
    assert body["error"] is None and body["model"] is None
    assert len(world.hosts) == 1 and world.hosts[0].returncode is None


async def test_manifest_read_error_fails(world: World, client: httpx.AsyncClient) -> None:
    def boom(store: S3Endpoint, uri: str) -> None:
        raise ConnectionError("store unreachable")

    world.manifest = boom
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body())
    body = await wait_state(client, "failed")
    assert "manifest" in body["error"] and "store unreachable" in body["error"]


async def test_engine_failure_event_fails_kills_and_prestarts_a_fresh_host(
    world: World, client: httpx.AsyncClient
) -> None:
    world.on_launch = "fail"
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body())
    body = await wait_state(client, "failed")
    assert body["error"] == "engine failed to start: FileNotFoundError: NoSuchKey"
    assert body["engine_url"] is None
    # The failed host was killed without a grace period, a fresh one started at once.
    await until("a fresh host", lambda: len(world.hosts) == 2)
    assert world.hosts[0].stops == [0.0] and world.hosts[1].returncode is None
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.post("/release", json={"assignment_id": "a1"})).status_code == 202
    await wait_state(client, "standby")


async def test_engine_host_crash_while_loading_reports_its_output(world: World, client: httpx.AsyncClient) -> None:
    world.on_launch = "crash"
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body())
    body = await wait_state(client, "failed")
    assert body["error"].startswith("engine exited with status 1 while loading")
    assert "OSError: boom" in body["error"]
    await client.post("/release", json={})
    await wait_state(client, "standby")
    assert len(world.hosts) == 2


async def test_engine_death_while_serving_fails(world: World, client: httpx.AsyncClient) -> None:
    await ready(client)
    world.hosts[0].exit(-9)
    body = await wait_state(client, "failed")
    assert body["error"].startswith("engine exited with status -9 while serving")
    await client.post("/release", json={})
    await wait_state(client, "standby")


async def test_engine_host_crash_in_standby_is_visible_and_recovers(world: World, client: httpx.AsyncClient) -> None:
    await wait_state(client, "standby")
    world.hosts[0].exit(1)
    body = await wait_state(client, "failed")
    assert "while standing by" in body["error"] and body["model"] is None
    # A fresh host was started; a release clears the failure.
    r = await client.post("/release", json={})
    assert r.status_code == 202
    await wait_state(client, "standby")
    assert len(world.hosts) == 2


# -- release -----------------------------------------------------------------------------


async def test_release_drains_then_stops_gracefully(world: World, client: httpx.AsyncClient) -> None:
    await ready(client)
    world.in_flight = [2, 1, 0, 3, 0, 0]  # the first zero is followed by a new request
    r = await client.post("/release", json={"assignment_id": "a1", "drain_timeout_s": 5})
    assert r.status_code == 202 and r.json()["state"] == "draining"
    body = await wait_state(client, "standby")
    assert world.in_flight == [0]  # read until two zeros in a row
    assert world.hosts[0].stops == [10.0]  # SIGTERM with the grace period
    assert body["model"] is None and body["assignment_id"] is None and body["engine_url"] is None
    assert body["phases"] == {"assigned": None, "snapshot_restored": None, "weights_loaded": None, "woken": None,
                              "engine_ready": None}
    # A second assignment goes to the fresh host.
    world.healthy = False
    r = await client.post("/assign", json=assign_body(assignment_id="a2"))
    assert r.status_code == 202
    await wait_state(client, "ready")
    assert len(world.hosts) == 2 and len(world.hosts[1].launches) == 1


async def test_release_gives_up_draining_after_the_timeout(world: World, client: httpx.AsyncClient) -> None:
    await ready(client)
    world.in_flight = [3]
    t0 = time.monotonic()
    await client.post("/release", json={"drain_timeout_s": 0.1})
    await wait_state(client, "standby")
    assert 0.1 <= time.monotonic() - t0 < 2.0


async def test_release_of_another_assignment_is_409(client: httpx.AsyncClient) -> None:
    await ready(client)
    r = await client.post("/release", json={"assignment_id": "someone-else"})
    assert r.status_code == 409
    assert r.json()["state"] == "ready" and "someone-else" in r.json()["error"]
    assert (await client.get("/state")).json()["state"] == "ready"


async def test_release_in_standby_is_a_noop(world: World, client: httpx.AsyncClient) -> None:
    await wait_state(client, "standby")
    r = await client.post("/release", json={"assignment_id": "old"})
    assert r.status_code == 200 and r.json()["state"] == "standby"
    r = await client.post("/release")  # no body at all
    assert r.status_code == 200
    assert len(world.hosts) == 1 and world.hosts[0].stops == []


async def test_release_while_loading_aborts_the_load(world: World, client: httpx.AsyncClient) -> None:
    world.on_launch = "hang"
    await wait_state(client, "standby")
    await client.post("/assign", json=assign_body())
    await until("the launch", lambda: world.hosts[0].launches)
    r = await client.post("/release", json={})
    assert r.status_code == 202
    await wait_state(client, "standby")
    assert world.hosts[0].stops == [0.0]  # killed, not drained


async def test_release_body_validation(client: httpx.AsyncClient) -> None:
    r = await client.post("/release", json={"drain_timeout_s": -1})
    assert r.status_code == 422 and "drain_timeout_s" in r.json()["error"]


# -- the asleep tier (vLLM sleep mode) ----------------------------------------------------


async def test_sleep_mode_reaches_the_engine_launch(world: World, client: httpx.AsyncClient) -> None:
    await ready(client, sleep_mode=True)
    cmd = world.hosts[0].launches[0]
    assert cmd.sleep_mode and cmd.env["VLLM_SERVER_DEV_MODE"] == "1"


async def test_sleep_then_the_same_model_wakes_instead_of_loading(world: World, client: httpx.AsyncClient) -> None:
    await ready(client, sleep_mode=True)
    world.in_flight = [1, 0, 0]  # one request still running: it drains first
    r = await client.post("/sleep", json={"assignment_id": "a1"})
    assert r.status_code == 202 and r.json()["state"] == "asleep"
    assert r.json()["engine_url"] is None  # nothing is routed to it
    await until("the engine put to sleep", lambda: world.asleep, 2, interval_s=0.005)
    assert world.sleeps == [1] and world.next_in_flight() == 0
    assert (await client.post("/sleep", json={})).status_code == 200  # already asleep
    t0 = time.time()
    r = await client.post("/assign", json=assign_body(assignment_id="a2", sleep_mode=True))
    assert r.status_code == 202
    body = await wait_state(client, "ready")
    assert body["assignment_id"] == "a2" and world.wakes == 1 and not world.asleep
    assert t0 <= body["phases"]["assigned"] <= body["phases"]["woken"] == body["phases"]["engine_ready"]
    assert body["phases"]["weights_loaded"] is None  # nothing was loaded
    assert len(world.hosts) == 1 and len(world.hosts[0].launches) == 1 and not world.hosts[0].stops
    assert "thaw_worker_engine_sleep_seconds_count 1.0" in (await client.get("/metrics")).text


async def test_sleep_needs_a_ready_engine_started_with_sleep_mode(client: httpx.AsyncClient) -> None:
    await wait_state(client, "standby")
    r = await client.post("/sleep", json={})
    assert r.status_code == 409 and r.json()["state"] == "standby"
    await ready(client)  # no sleep_mode
    r = await client.post("/sleep", json={})
    assert r.status_code == 409 and "sleep mode" in r.json()["error"]
    r = await client.post("/sleep", json={"assignment_id": "other"})
    assert r.status_code == 409


async def test_asleep_worker_refuses_another_model_and_releases_to_standby(
    world: World, client: httpx.AsyncClient
) -> None:
    await ready(client, sleep_mode=True)
    assert (await client.post("/sleep", json={})).status_code == 202
    r = await client.post("/assign", json=assign_body(assignment_id="a2", model="other",
                                                      uri="s3://thaw/models/other", sleep_mode=True))
    assert r.status_code == 409 and "release it" in r.json()["error"]
    r = await client.post("/release", json={})
    assert r.status_code == 202
    body = await wait_state(client, "standby")
    assert body["model"] is None and world.wakes == 0
    assert world.hosts[0].stops  # the sleeping engine was stopped, a fresh host stands by
    assert len(world.hosts) == 2


async def test_a_failed_sleep_or_wake_fails_the_worker_with_the_reason(world: World, client: httpx.AsyncClient) -> None:
    await ready(client, sleep_mode=True)
    world.sleep_error = "CUDA error: out of memory"
    await client.post("/sleep", json={})
    body = await wait_state(client, "failed")
    assert "putting the engine to sleep failed: CUDA error: out of memory" in body["error"]
    await client.post("/release", json={})
    world.sleep_error = None
    await ready(client, sleep_mode=True)
    await client.post("/sleep", json={})
    world.wake_error = "engine crashed"
    await client.post("/assign", json=assign_body(assignment_id="a3", sleep_mode=True))
    body = await wait_state(client, "failed")
    assert "waking the engine failed: engine crashed" in body["error"]
