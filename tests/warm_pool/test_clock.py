"""The controller's stepped clock (``controller.stepped_clock``, warm_pool.clock): a
scheduled window reached by steps instead of by waiting, and the steps the API refuses."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.warm_pool.in_process import (
    TOKEN,
    InProcessProvider,
    controller,
    fleet_config,
    steps_pass,
    until,
)
from thaw.config import ThawConfig, parse_config
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.clock import SteppedClock, largest_step_s
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def clock_config(*, prewarm: list[dict[str, object]] | None = None) -> ThawConfig:
    data = fleet_config().model_dump(mode="json")
    # Steps of minutes: a worker timeout that heartbeats every 0.1 s outlast.
    data["cluster"].update({"heartbeat_interval_s": 0.1, "worker_timeout_s": 300})
    data["controller"]["stepped_clock"] = True
    if prewarm is not None:
        data["models"][0]["prewarm"] = prewarm
    return parse_config(data)


def ready(m: PoolManager, model: str = "demo") -> int:
    return next(r.replicas.get("ready", 0) for r in m.status().models if r.name == model)


async def test_steps_reach_a_scheduled_window_and_its_replica_comes_up_only_then(provider: InProcessProvider) -> None:
    # A window at the next minute at least 45 s away (cron has minutes); steps, not the
    # wall clock, take the controller there.
    clock = SteppedClock()
    opens = math.ceil((clock() + 45) / 60) * 60
    at = datetime.fromtimestamp(opens, UTC)
    cfg = clock_config(prewarm=[{"cron": f"{at.minute} {at.hour} * * *", "for_s": 600}])
    port = int(provider.controller_url.rsplit(":", 1)[1])
    async with controller(cfg, provider, port, clock=clock) as c, httpx.AsyncClient(base_url=c.url, headers=AUTH) as http:
        m = c.manager
        await until("a standby", lambda: any(v.state.value == "standby" for v in m.fleet.views(clock()).values()), m)
        # To 5 s before the window: nothing is assigned however long it runs.
        first = opens - 5 - clock()
        r = await http.post("/v1/pool/clock", json={"advance_s": first})
        assert r.status_code == 200, r.text
        assert r.json()["stepped_s"] == pytest.approx(clock.stepped_s) and r.json()["now"] < opens
        await steps_pass(m)
        assert ready(m) == 0 and not [e for e in m.parts.event_log.events if e.kind == "assign"]
        # Across its opening: the schedule's replica comes up with no request.
        r = await http.post("/v1/pool/clock", json={"advance_s": 6})
        assert r.status_code == 200, r.text
        await until("the scheduled replica", lambda: ready(m) == 1, m)
        assigned = [e for e in m.parts.event_log.events if e.kind == "assign"]
        assert [e.reason for e in assigned] == ["prewarm"] and assigned[0].at >= opens
        # Each step is in the decision log, with who asked.
        steps = [e for e in m.parts.event_log.events if e.kind == "clock"]
        assert [e.inputs["advance_s"] for e in steps] == [first, 6] and all("unknown" in e.inputs["by"] for e in steps)
        # 600 s later (in steps the heartbeats keep up with) the window has closed and
        # the model, with no traffic, lets its replica go.
        for _ in range(3):
            assert (await http.post("/v1/pool/clock", json={"advance_s": 210})).status_code == 200
            await steps_pass(m, 3)
        await until("the window closed", lambda: ready(m) == 0, m)


def app_for(cfg: ThawConfig, root: str, clock: Callable[[], float]) -> FastAPI:
    data = cfg.model_dump(mode="json")
    data["data_dir"] = root
    m = build_pool(parse_config(data), {}, HttpWorkerControl(TOKEN), state_dir=Path(root), clock=clock)
    return create_pool_app(m, TOKEN, manage_lifecycle=False)


async def test_the_clock_api_refuses_what_it_cannot_do_with_the_reason() -> None:
    with tempfile.TemporaryDirectory() as root:
        # A controller on the wall clock answers its time and refuses a step (409).
        wall = app_for(fleet_config(), root, time.time)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=wall), base_url="http://c", headers=AUTH) as c:
            view = (await c.get("/v1/pool/clock")).json()
            assert view["steppable"] is False and view["stepped_s"] == 0 and abs(view["now"] - time.time()) < 60
            r = await c.post("/v1/pool/clock", json={"advance_s": 1})
            assert r.status_code == 409 and "stepped_clock is false" in r.json()["error"]
            assert (await c.post("/v1/pool/clock", json={"advance_s": 1}, headers={"Authorization": "Bearer x"})
                    ).status_code == 401
    with tempfile.TemporaryDirectory() as root:
        cfg = clock_config()
        clock = SteppedClock(wall=lambda: 1000.0)
        app = app_for(cfg, root, clock)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c", headers=AUTH) as c:
            assert (await c.get("/v1/pool/clock")).json() == {
                "now": 1000.0, "steppable": True, "stepped_s": 0.0, "largest_step_s": largest_step_s(cfg)}
            # Longer than the workers' heartbeats outlast: 422, naming the bound.
            r = await c.post("/v1/pool/clock", json={"advance_s": 300})
            assert r.status_code == 422 and "step at most 299.8 s" in r.json()["error"], r.text
            for bad in ("0", "-5", '"soon"', "null", "NaN", "Infinity"):
                r = await c.post("/v1/pool/clock", content=f'{{"advance_s": {bad}}}',
                                 headers={"Content-Type": "application/json"})
                assert r.status_code == 422 and "advance_s" in r.json()["error"], (bad, r.text)
            assert (await c.post("/v1/pool/clock", json={"advance_s": 2, "at": 5})).status_code == 422
            assert clock() == 1000.0  # nothing refused moved it
            r = await c.post("/v1/pool/clock", json={"advance_s": 299.8})
            assert r.status_code == 200 and r.json()["now"] == pytest.approx(1299.8)
            # The schema documents both refusals.
            responses = app.openapi()["paths"]["/v1/pool/clock"]["post"]["responses"]
            assert {"409", "422"} <= set(responses)


def test_a_clock_steps_forward_only() -> None:
    clock = SteppedClock(wall=lambda: 10.0)
    clock.advance(5)
    assert clock() == 15.0
    for s in (0, -1):
        with pytest.raises(ValueError, match="forward only"):
            clock.advance(s)
    assert clock() == 15.0
