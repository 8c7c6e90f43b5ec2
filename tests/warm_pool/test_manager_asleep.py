"""The asleep tier through the controller's real loop: worker agents (their HTTP API and
heartbeats on loopback, with a fake engine host and a fake engine that has vLLM's sleep
mode) are put to sleep when idle and woken, not reloaded, by the next request."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.warm_pool.in_process import (
    Controller,
    InProcessProvider,
    controller,
    fleet_config,
    states,
    until,
)
from thaw.embedded_store import free_port
from thaw.wire import AssignRequest, WorkerStatus
from warm_pool.manager import PoolManager
from warm_pool.policy.decide import ModelActivity


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Controller, InProcessProvider]]:
    port = free_port()
    provider = InProcessProvider(tmp_path, f"http://127.0.0.1:{port}")
    try:
        async with controller(fleet_config(gpu=True, asleep_ttl_s=600), provider, port) as c:
            yield c, provider
    finally:
        await provider.shutdown()


def replicas(m: PoolManager) -> list[str]:
    return [r.worker_id for r in m.feed.table.models["demo"].replicas] if "demo" in m.feed.table.models else []


async def test_idle_replica_sleeps_and_the_next_request_wakes_it(
    fleet: tuple[Controller, InProcessProvider],
) -> None:
    c, provider = fleet
    m = c.manager
    await until("a standby", lambda: "standby" in states(m).values(), m)
    m.traffic.demand("demo")
    await until("a ready replica", lambda: replicas(m), m)
    home = replicas(m)[0]
    # No traffic for idle_grace_s (0.3 s): asleep, not released; out of the route table.
    await until("asleep", lambda: states(m).get(home) == "asleep", m)
    world = provider.worlds[home]
    await until("the engine asleep", lambda: world.asleep, m)
    assert world.sleeps == [1] and not replicas(m)
    launched = provider.launched
    # A request: the asleep replica wakes (no load, no new instance).
    m.traffic.report("act-1", {"demo": ModelActivity(queued=1, last_request_at=time.time())})
    m.traffic.demand("demo")
    await until("woken", lambda: replicas(m), m)
    replica = m.feed.table.models["demo"].replicas[0]
    assert replica.worker_id == home and world.wakes == 1 and not world.asleep
    assert replica.phases.woken is not None
    assert len(world.hosts[0].launches) == 1  # loaded once, woken once
    assert provider.launched == launched


async def test_a_replica_that_cannot_sleep_is_released_instead(
    fleet: tuple[Controller, InProcessProvider], monkeypatch: pytest.MonkeyPatch,
) -> None:
    c, provider = fleet
    m = c.manager
    assign = m.parts.control.assign

    async def without_sleep_mode(url: str, req: AssignRequest) -> WorkerStatus:
        # An engine started without sleep mode (as by a config that changed under it).
        return await assign(url, req.model_copy(update={"sleep_mode": False}))

    monkeypatch.setattr(m.parts.control, "assign", without_sleep_mode)
    await until("a standby", lambda: "standby" in states(m).values(), m)
    m.traffic.demand("demo")
    await until("a ready replica", lambda: replicas(m), m)
    home = replicas(m)[0]
    # Idle: the sleep is refused (409), so the replica is released to standby (or, as an
    # excess standby, terminated).
    await until("released", lambda: states(m).get(home) in ("standby", None) and not replicas(m), m)
    assert provider.worlds[home].sleeps == []
