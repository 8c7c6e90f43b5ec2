"""A fleet in one process for the controller's tests: the controller's real app and
manager on a loopback port, and worker agents (their real HTTP API and heartbeats, with
a fake engine host and engine) started by an in-process provider."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from tests import waiting
from tests.worker.fakes import FakeEngine, FakeHost, World
from thaw.config import ThawConfig, parse_config
from thaw.embedded_store import free_port
from thaw.objstore import S3Endpoint, WeightsCheck, WeightsProblem
from thaw.serve import server_config
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager
from warm_pool.providers.provider import Instance, InstanceState, Provider
from worker.api import create_app
from worker.host import OnEvent
from worker.settings import AgentSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
TOKEN = "fleet-test-token"


def registry_config(**changes: Any) -> ThawConfig:
    """The example config for the registry's tests: models only under s3://thaw/models/,
    a second tenant (acme)."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = "/tmp/unused"
    data["object_store"]["allowed_prefixes"] = ["s3://thaw/models/"]
    data["tenants"].append({"name": "acme", "api_key_hashes": ["sha256:" + "a" * 64], "allowed_models": ["*"]})
    data.update(changes)
    return parse_config(data)


@dataclass
class FakeStoreReader:
    """The store as the model registry reads it: complete weights of ``sizes`` bytes at
    each URI it holds (``WeightsProblem`` for any other), each with its own digest."""

    sizes: dict[str, int] = field(default_factory=dict)
    default_bytes: int | None = 64 * 2**20
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)

    def check_weights(self, uri: str) -> WeightsCheck:
        self.checked.append(uri)
        size = self.sizes.get(uri.rstrip("/"), self.default_bytes)
        if size is None:
            raise WeightsProblem(f"no manifest at {uri}/thaw-manifest.json")
        return WeightsCheck(f"{abs(hash((uri, size))):064x}"[-64:], size)

    def read_config(self, uri: str) -> dict[str, Any] | None:
        return self.configs.get(uri.rstrip("/"))


async def serve(app: Any, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    # As the services serve (thaw.serve): a shutdown waits at most 10 s for open requests.
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, graceful_s=10))
    task = asyncio.create_task(server.serve())
    await waiting.until("the server started (or its task ended)", lambda: server.started or task.done(), 30)
    if not server.started:
        await task
        raise RuntimeError("server did not start")
    return server, task


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` served on a free loopback port until the block ends: its base URL."""
    port = free_port()
    server, task = await serve(app, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class InProcessProvider:
    """Worker agents as in-process uvicorn servers, each with its own fake world. Like a
    real provider, it outlives a controller: its instances are adopted by the next."""

    root: Path
    controller_url: str
    kind: str = "local"
    worlds: dict[str, World] = field(default_factory=dict)
    launched: int = 0
    _servers: dict[str, tuple[Instance, uvicorn.Server, asyncio.Task[None]]] = field(default_factory=dict)

    async def launch(self, shape: str, worker_id: str, *, term: int | None = None) -> Instance:
        if worker_id in self._servers:
            return self._servers[worker_id][0]
        self.launched += 1
        world = self.worlds[worker_id] = World()

        async def spawn(on_event: OnEvent) -> FakeHost:
            h = FakeHost(world, on_event)
            world.hosts.append(h)
            asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
            return h

        port = free_port()
        settings = AgentSettings(worker_id=worker_id, instance_id=f"i-{worker_id}", shape=shape, port=port,
                                 data_dir=self.root / worker_id, store=S3Endpoint("http://127.0.0.1:9", "AK", "SK"),
                                 controller_url=self.controller_url, token=TOKEN, heartbeat_interval_s=0.1,
                                 ready_poll_s=0.01, in_flight_poll_s=0.01, drain_poll_s=0.01)
        app = create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                         manifest_reader=lambda store, uri: {"ok": True})
        server, task = await serve(app, port)
        inst = Instance(f"i-{worker_id}", worker_id, shape, time.time(), InstanceState.RUNNING,
                        control_url=f"http://127.0.0.1:{port}")
        self._servers[worker_id] = (inst, server, task)
        return inst

    async def instances(self) -> list[Instance]:
        return [i for i, _, _ in self._servers.values()]

    async def terminate(self, instance_id: str) -> None:
        for wid, (inst, server, task) in list(self._servers.items()):
            if inst.instance_id == instance_id:
                del self._servers[wid]
                server.should_exit = True
                await task

    async def stop(self, instance_id: str) -> None:
        raise NotImplementedError

    async def start(self, instance_id: str) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Workers keep running (the controller is what closes)."""

    async def shutdown(self) -> None:
        for inst, _, _ in list(self._servers.values()):
            await self.terminate(inst.instance_id)


def fleet_config(*, gpu: bool = False, **autoscaling: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cluster"] = {"heartbeat_interval_s": 0.1, "worker_timeout_s": 2.0}
    data["models"][0]["autoscaling"].update({"idle_grace_s": 0.3, **autoscaling})
    data["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 3})
    if gpu:  # the asleep tier needs a GPU shape (vLLM sleep mode); the fakes have it
        data["shapes"] = [{"name": "cpu-local", "gpu_type": "h100-80gb", "gpu_count": 1, "gpu_memory_gib": 80,
                           "host_memory_gib": 128, "price_per_hour_usd": 0}]
    return parse_config(data)


@dataclass
class Controller:
    manager: PoolManager
    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]

    async def stop(self) -> None:
        # As `thaw controller` does on SIGTERM: stop deciding, then close the server.
        await self.manager.stop_deciding()
        self.server.should_exit = True
        await self.task


@asynccontextmanager
async def controller(cfg: ThawConfig, provider: Provider, port: int, **kw: Any) -> AsyncIterator[Controller]:
    """The controller's app (with the cluster token) serving ``provider``'s shape."""
    m = build_pool(cfg, {p.shape: provider for p in cfg.pools}, HttpWorkerControl(TOKEN),  # type: ignore[misc]
                   poll_interval_s=0.05, adopt_grace_s=kw.pop("adopt_grace_s", 0.3), refresh_interval_s=0.2, **kw)
    # (kw: e.g. state_dir, to keep what a restart must find)
    server, task = await serve(create_pool_app(m, TOKEN), port)
    c = Controller(m, f"http://127.0.0.1:{port}", server, task)
    try:
        yield c
    finally:
        if not task.done():
            await c.stop()


async def until(what: str, pred: Any, m: PoolManager, timeout_s: float = 10.0) -> None:
    await waiting.until(what, pred, timeout_s, detail=lambda: m.status().model_dump_json(indent=1))


async def steps_pass(m: PoolManager, n: int = 5, timeout_s: float = 30.0) -> None:
    """``n`` more turns of the manager's loop (each decides and acts): what a test waits
    for to say that nothing happened, whatever the machine's speed."""
    start = m.steps
    await waiting.until(f"{n} turns of the loop", lambda: m.steps >= start + n, timeout_s)


def states(m: PoolManager) -> dict[str, str]:
    return {wid: v.state.value for wid, v in m.fleet.views(time.time()).items()}


def on_postgres(cfg: ThawConfig, provider: Provider, postgres_url: str, lease_s: float,
                ) -> Callable[[str, int], contextlib.AbstractAsyncContextManager[Controller]]:
    """``one(name, port)``: a controller named ``name`` on ``port`` that shares the
    PostgreSQL at ``postgres_url`` (its state and its lease) with the others ``one`` makes."""
    from warm_pool.db import Db
    from warm_pool.leader import LeaseStore

    def one(name: str, port: int) -> contextlib.AbstractAsyncContextManager[Controller]:
        return controller(cfg, provider, port, state_db=Db.postgres(postgres_url),
                          lease=LeaseStore(Db.postgres(postgres_url)), url=f"http://127.0.0.1:{port}",
                          controller_id=name, lease_s=lease_s, store_reader=FakeStoreReader())

    return one
