"""The asleep tier through the pool manager's real loop: worker agents (their HTTP API
on loopback, with a fake engine host and a fake engine that has vLLM's sleep mode)
are put to sleep when idle and woken, not reloaded, by the next request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml

from tests.worker.test_api import FakeEngine, FakeHost, World
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint
from warm_pool.manager import PoolManager
from warm_pool.policy import ModelActivity
from warm_pool.providers import WorkerHandle
from worker.api import create_app
from worker.host import OnEvent
from worker.settings import AgentSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"


class InProcessProvider:
    """Worker agents as in-process uvicorn servers, each with its own fake world."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.worlds: dict[str, World] = {}
        self._servers: dict[str, tuple[WorkerHandle, uvicorn.Server, asyncio.Task[None]]] = {}
        self.launched = 0

    async def launch(self, shape: str) -> WorkerHandle:
        self.launched += 1
        wid = f"w{self.launched}"
        world = self.worlds[wid] = World()

        async def spawn(on_event: OnEvent) -> FakeHost:
            h = FakeHost(world, on_event)
            world.hosts.append(h)
            asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
            return h

        port = free_port()
        settings = AgentSettings(worker_id=wid, shape=shape, port=port, data_dir=self.root / wid,
                                 ready_poll_s=0.01, in_flight_poll_s=0.01, drain_poll_s=0.01)
        app = create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                         manifest_reader=lambda store, uri: {"ok": True})
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                               lifespan="on"))
        task = asyncio.create_task(server.serve())
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
            await asyncio.sleep(0.01)
        handle = WorkerHandle(wid, shape, f"http://127.0.0.1:{port}")
        self._servers[wid] = (handle, server, task)
        return handle

    async def terminate(self, worker_id: str) -> None:
        _, server, task = self._servers.pop(worker_id)
        server.should_exit = True
        await task

    def workers(self) -> list[WorkerHandle]:
        return [h for h, _, _ in self._servers.values()]

    def exited(self, worker_id: str) -> int | None:
        return None

    async def close(self) -> None:
        for wid in list(self._servers):
            await self.terminate(wid)


def gpu_config() -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["shapes"] = [{"name": "cpu-local", "gpu_type": "h100-80gb", "gpu_count": 1, "gpu_memory_gib": 80,
                       "host_memory_gib": 128, "price_per_hour_usd": 0}]
    data["models"][0]["autoscaling"].update({"idle_grace_s": 0.3, "asleep_ttl_s": 600})
    data["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 3})
    return parse_config(data)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[tuple[PoolManager, InProcessProvider]]:
    provider = InProcessProvider(tmp_path)
    m = PoolManager(gpu_config(), provider, S3Endpoint("http://127.0.0.1:9", "AK", "SK"), poll_interval_s=0.05)
    await m.start()
    try:
        yield m, provider
    finally:
        await m.close()


async def until(what: str, pred: Any, m: PoolManager, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {m.status()}")
        await asyncio.sleep(0.02)


def states(m: PoolManager) -> dict[str, str]:
    return {wid: w.view.state for wid, w in m.workers.items()}


async def test_idle_replica_sleeps_and_the_next_request_wakes_it(
    manager: tuple[PoolManager, InProcessProvider],
) -> None:
    m, provider = manager
    await until("a standby", lambda: "standby" in states(m).values(), m)
    m.demand("demo")
    await until("a ready replica", lambda: m.routes["models"].get("demo", {}).get("replicas"), m)
    home = m.routes["models"]["demo"]["replicas"][0]["worker_id"]
    # No traffic for idle_grace_s (0.3 s): asleep, not released; out of the route table.
    await until("asleep", lambda: states(m).get(home) == "asleep", m)
    world = provider.worlds[home]
    await until("the engine asleep", lambda: world.asleep, m)
    assert world.sleeps == [1] and not m.routes["models"]["demo"]["replicas"]
    launched = provider.launched
    # A request: the asleep replica wakes (no load, no new instance).
    m.report("act-1", {"demo": ModelActivity(queued=1, last_request_at=time.time())})
    m.demand("demo")
    await until("woken", lambda: m.routes["models"]["demo"]["replicas"], m)
    replica = m.routes["models"]["demo"]["replicas"][0]
    assert replica["worker_id"] == home and world.wakes == 1 and not world.asleep
    assert replica["phases"]["woken"] is not None
    assert len(world.hosts[0].launches) == 1  # loaded once, woken once
    assert provider.launched == launched


async def test_a_replica_that_cannot_sleep_is_released_instead(
    manager: tuple[PoolManager, InProcessProvider], monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, provider = manager
    post = m._http.post

    async def without_sleep_mode(url: str, **kw: Any) -> Any:
        # An engine started without sleep mode (as by a config that changed under it).
        if url.endswith("/assign"):
            kw["json"] = {**kw["json"], "sleep_mode": False}
        return await post(url, **kw)

    monkeypatch.setattr(m._http, "post", without_sleep_mode)
    await until("a standby", lambda: "standby" in states(m).values(), m)
    m.demand("demo")
    await until("a ready replica", lambda: m.routes["models"].get("demo", {}).get("replicas"), m)
    home = m.routes["models"]["demo"]["replicas"][0]["worker_id"]
    # Idle: the sleep is refused (409), so the replica is released to standby (or, as an
    # excess standby, terminated).
    await until("released", lambda: states(m).get(home) in ("standby", None)
                and not m.routes["models"]["demo"]["replicas"], m)
    assert provider.worlds[home].sleeps == []
