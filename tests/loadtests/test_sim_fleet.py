"""The simulated workers of `thaw bench control-plane` (loadtests/sim_fleet.py) against the
controller's real app and loop: they register by heartbeat, take an assignment, become
ready, serve a stream from their simulated engine, are released when idle, and refuse a
call of an older leader's term."""

from __future__ import annotations

import json

import httpx
import pytest

from loadtests.sim_fleet import SimFleet
from tests import waiting
from tests.warm_pool.at_scale import sim_fleet
from tests.warm_pool.in_process import TOKEN, controller, fleet_config, states, until
from thaw.controllers import TERM_HEADER
from thaw.embedded_store import free_port
from thaw.wire import AssignRequest, WorkerStatus
from warm_pool.providers.static import StaticProvider

WORKERS = 3


async def test_simulated_workers_register_serve_and_are_released_when_idle() -> None:
    base = fleet_config()
    pool = base.pools[0].model_copy(update={"standby_min": WORKERS, "standby_max": WORKERS, "max_instances": WORKERS})
    cfg = base.model_copy(update={"pools": [pool]})
    port = free_port()
    async with controller(cfg, StaticProvider(), port, adopt_grace_s=1.0) as c, \
            sim_fleet(c.url, WORKERS, load_s=0.2, first_heartbeat_within_s=0.2) as fleet:
        m = c.manager
        await until("every simulated worker adopted, standing by",
                    lambda: m.adopted and list(states(m).values()) == ["standby"] * WORKERS, m)
        m.traffic.demand("demo")
        await until("a ready replica of demo in the route table",
                    lambda: bool(m.feed.table.models.get("demo") and m.feed.table.models["demo"].replicas), m)
        replica = m.feed.table.models["demo"].replicas[0]
        async with httpx.AsyncClient(timeout=10) as http:
            body = {"model": replica.served_model_name, "stream": True, "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}
            async with http.stream("POST", f"{replica.url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                lines = [x async for x in r.aiter_lines() if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) == 5
        assert json.loads(lines[0][6:])["model"] == replica.served_model_name
        # Idle past its grace (0.3 s): released, and the worker stands by again.
        await until("the replica released and every worker standing by",
                    lambda: fleet.stats()["releases"] == 1 and list(states(m).values()) == ["standby"] * WORKERS, m)
        assert fleet.stats()["assigns"] == 1 and fleet.heartbeats["refused"] == 0
        # No engine runs there now: a request to it has its connection dropped, as a real
        # worker's closed engine port refuses it (the activator retries another replica).
        async with httpx.AsyncClient(timeout=10) as http:
            with pytest.raises(httpx.TransportError):
                await http.post(f"{replica.url}/v1/chat/completions", json=body)


@pytest.mark.parametrize("busy", [False, True])
async def test_the_control_api_answers_as_a_worker(busy: bool) -> None:
    fleet = SimFleet(free_port(), "http://127.0.0.1:9", TOKEN, workers=1, load_s=0.0)
    w = next(iter(fleet.workers.values()))
    req = AssignRequest(assignment_id="a-1", model="demo", uri="s3://thaw/models/demo", served_model_name="demo-chat",
                        max_model_len=256)
    status, answer = await fleet.control(w, "POST", "/assign", {}, req.model_dump_json().encode())
    assert status == 202 and isinstance(answer, WorkerStatus) and answer.state.value == "loading"
    # The same assignment again is a no-op; another is refused while it is not standing by.
    again, _ = await fleet.control(w, "POST", "/assign", {}, req.model_dump_json().encode())
    other = req.model_copy(update={"assignment_id": "a-2"})
    refused, why = await fleet.control(w, "POST", "/assign", {}, other.model_dump_json().encode())
    assert again == 202 and refused == 409 and "not standby" in why["error"]
    # A controller of an older term is fenced once a newer one was heard of.
    assert w.fence.admits(5)
    fenced, why = await fleet.control(w, "POST", "/release", {TERM_HEADER.lower(): "4"}, b"{}")
    assert fenced == 409 and "no longer leads" in why["error"]
    bad, why = await fleet.control(w, "POST", "/assign", {}, b'{"model": 1}')
    assert bad == 422
    unsupported, why = await fleet.control(w, "POST", "/sleep", {}, b"{}")
    assert unsupported == 409 and "simulated engine" in why["error"]
    if busy:
        w.in_flight = 1
    released, _ = await fleet.control(w, "POST", "/release", {TERM_HEADER.lower(): "5"}, b'{"drain_timeout_s": 0.2}')
    assert released == 202 and w.state.value == "draining"
    await waiting.until("the worker standing by after its drain", lambda: w.state.value == "standby", 5)
    await fleet.close()
