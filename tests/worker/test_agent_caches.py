"""The agent's weight caches: what a launch is told, what the status says, what is
given back. A fake engine host and engine (no vLLM); the loader's side of the tiers is
tested against the real store in tests/weight_streaming/test_s3_streaming.py."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.waiting import until
from tests.worker.fakes import SECRET, TOKEN, FakeEngine, FakeHost, World, ready, wait_state
from thaw.objstore import S3Endpoint
from thaw.units import GiB
from weight_streaming.cache import DiskCache
from worker.api import create_app
from worker.host import OnEvent
from worker.settings import AgentSettings


def cache_dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "host-cache", tmp_path / "disk-cache"


def agent_app(world: World, tmp_path: Path, **caches: Any) -> Any:
    """The agent's app on fake engine hosts that import at once, with these cache settings."""
    async def spawn(on_event: OnEvent) -> FakeHost:
        h = FakeHost(world, on_event)
        world.hosts.append(h)
        asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
        return h

    settings = AgentSettings(worker_id="w1", shape="cpu-small", port=0, data_dir=tmp_path / "data",
                             store=S3Endpoint("http://127.0.0.1:9", "AK", SECRET), token=TOKEN,
                             ready_poll_s=0.01, in_flight_poll_s=0.01, drain_poll_s=0.01, **caches)
    return create_app(settings, spawn_host=spawn, engine_client=lambda url: FakeEngine(world, url),
                      manifest_reader=lambda store, uri: world.manifest(store, uri))


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[World, httpx.AsyncClient]]:
    world = World()
    host_dir, disk_dir = cache_dirs(tmp_path)
    app = agent_app(world, tmp_path, disk_cache_dir=disk_dir, disk_cache_max_bytes=3 * GiB,
                    host_cache_dir=host_dir, host_cache_max_bytes=GiB // 2, cache_scan_interval_s=0.05)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            yield world, c


def put_model(cache: DiskCache, uri: str, sizes: list[int]) -> None:
    """Cache a model's files the way the loader does, and record it."""
    files = []
    for i, n in enumerate(sizes):
        key = f"{uri.removeprefix('s3://thaw/')}/model-{i}.safetensors"
        w = cache.begin("thaw", key, "etag", n)
        assert w is not None
        w.write(0, b"\0" * n)
        w.commit().result()
        files.append(("thaw", key, "etag", n))
    cache.record_model(uri, files)


async def test_a_thaw_load_is_told_the_tiers_and_its_report_becomes_the_status(
    client: tuple[World, httpx.AsyncClient], tmp_path: Path,
) -> None:
    world, c = client
    host_dir, disk_dir = cache_dirs(tmp_path)
    world.load_report = {"bytes": 1000, "seconds": 0.5, "sources": {"host": 600, "s3": 400}}
    body = await ready(c, engine={"load_format": "thaw", "extra": {"model_loader_extra_config": {"concurrency": 4}}})
    extra = world.hosts[0].launches[0].engine.extra["model_loader_extra_config"]
    assert extra == {"concurrency": 4, "host_cache_dir": str(host_dir), "host_cache_max_gib": 0.5,
                     "cache_dir": str(disk_dir), "cache_max_gib": 3.0, "verify_sha256": True,
                     "verify_tensors": True}
    # One file from the store makes it an s3 load, whatever the caches held.
    assert body["load"] == {"tier": "s3", "swap": False, "seconds": 0.5, "bytes": 1000,
                            "sources": {"host": 600, "s3": 400}, "steps_s": {}, "tensors_verified": None}
    assert body["load_bytes_per_s"] == {}  # a mixed load says nothing about one source's rate

    await c.post("/release", json={"drain_timeout_s": 0})
    body = await wait_state(c, "standby")
    assert body["load"] is None
    world.load_report = {"bytes": 1000, "seconds": 0.25, "sources": {"host": 1000}}
    body = await ready(c, assignment_id="a2", engine={"load_format": "thaw"})
    assert body["load"]["tier"] == "host"
    assert body["load_bytes_per_s"] == {"host": 4000.0}


async def test_other_loaders_get_no_cache_settings_and_report_the_store(
    client: tuple[World, httpx.AsyncClient],
) -> None:
    world, c = client
    body = await ready(c, engine={"load_format": "runai_streamer"})
    assert "model_loader_extra_config" not in world.hosts[0].launches[0].engine.extra
    assert body["load"] == {"tier": "s3", "swap": False, "seconds": None, "bytes": None, "sources": {},
                            "steps_s": {}, "tensors_verified": None}


async def test_a_thaw_load_without_caches_still_checks_every_hash(tmp_path: Path) -> None:
    """A corrupt object in the store fails its load on the manifest's sha256 whether or
    not the worker keeps copies; a worker whose settings turn the check off says so (and
    so for a swap's check of every tensor)."""
    for verify in (True, False):
        world = World()
        app = agent_app(world, tmp_path / str(verify), cache_verify_sha256=verify, cache_verify_tensors=verify)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent",
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                await ready(c, engine={"load_format": "thaw"})
        extra = world.hosts[0].launches[0].engine.extra["model_loader_extra_config"]
        assert extra == {"verify_sha256": verify, "verify_tensors": verify}


async def test_status_lists_what_the_tiers_hold_and_the_host_tier_goes_when_the_agent_stops(
    tmp_path: Path, client: tuple[World, httpx.AsyncClient],
) -> None:
    _, c = client
    host_dir, disk_dir = cache_dirs(tmp_path)
    put_model(DiskCache(disk_dir, 3 * GiB), "s3://thaw/models/a", [100, 200])
    put_model(DiskCache(host_dir, GiB), "s3://thaw/models/a", [100])  # part of it
    put_model(DiskCache(disk_dir, 3 * GiB), "s3://thaw/models/b", [50])
    want = [
        {"uri": "s3://thaw/models/a", "tier": "disk", "bytes": 300, "total_bytes": 300},
        {"uri": "s3://thaw/models/a", "tier": "host", "bytes": 100, "total_bytes": 100},
        {"uri": "s3://thaw/models/b", "tier": "disk", "bytes": 50, "total_bytes": 50},
    ]

    async def listed() -> bool:
        return bool((await c.get("/state")).json()["cached"] == want)

    await until("the cached models listed", listed, 4)
    metrics = (await c.get("/metrics")).text
    assert 'thaw_worker_cache_bytes{tier="disk"} 350.0' in metrics
    assert 'thaw_worker_cache_bytes{tier="host"} 100.0' in metrics


async def test_stopping_gives_the_host_tier_back_and_keeps_the_disk(tmp_path: Path) -> None:
    host_dir, disk_dir = cache_dirs(tmp_path)
    app = agent_app(World(), tmp_path, disk_cache_dir=disk_dir, disk_cache_max_bytes=GiB,
                    host_cache_dir=host_dir, host_cache_max_bytes=GiB)
    async with app.router.lifespan_context(app):
        put_model(DiskCache(host_dir, GiB), "s3://thaw/models/a", [10])
        put_model(DiskCache(disk_dir, GiB), "s3://thaw/models/a", [10])
    assert not host_dir.exists()
    assert DiskCache(disk_dir, GiB).models()[0].complete


async def test_host_caches_of_dead_agents_are_removed_at_start(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    host_dir, _ = cache_dirs(tmp_path)
    orphan, alive, other = host_dir.parent / "w-dead", host_dir.parent / "w-alive", host_dir.parent / "not-ours"
    for d, owner in ((orphan, str(proc.pid)), (alive, str(os.getpid())), (other, None)):
        d.mkdir(parents=True)
        (d / "weights").write_bytes(b"x")
        if owner:
            (d / ".owner").write_text(owner)
    app = agent_app(World(), tmp_path, host_cache_dir=host_dir, host_cache_max_bytes=GiB)
    async with app.router.lifespan_context(app):
        assert not orphan.exists()
        assert (alive / "weights").exists() and (other / "weights").exists()
        assert (host_dir / ".owner").read_text() == str(os.getpid())


async def test_the_agent_reaches_its_engine_locally_and_advertises_the_other_address(tmp_path: Path) -> None:
    """Behind a proxy, NAT or load balancer the advertised address is others' way in;
    the agent's own health and in-flight polls go to where the engine listens."""
    world, engines = World(), []

    async def spawn(on_event: OnEvent) -> FakeHost:
        h = FakeHost(world, on_event)
        world.hosts.append(h)
        asyncio.get_running_loop().call_later(0.01, h.emit, "imported")
        return h

    def engine(url: str) -> FakeEngine:
        engines.append(url)
        return FakeEngine(world, url)

    settings = AgentSettings(worker_id="w1", shape="cpu", port=0, data_dir=tmp_path, host="127.0.0.2",
                             advertise_host="10.1.2.3", store=S3Endpoint("http://127.0.0.1:9", "AK", SECRET),
                             token=TOKEN, ready_poll_s=0.01, in_flight_poll_s=0.01, drain_poll_s=0.01)
    app = create_app(settings, spawn_host=spawn, engine_client=engine,
                     manifest_reader=lambda store, uri: world.manifest(store, uri))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            body = await ready(c)
    launch = world.hosts[0].launches[0]
    assert launch.host == "127.0.0.2"
    assert engines == [f"http://127.0.0.2:{launch.port}"]
    assert body["engine_url"] == f"http://10.1.2.3:{launch.port}"
