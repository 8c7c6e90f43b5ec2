"""Packed engines on one worker (``worker.engines``), with fake engine hosts: each is a
worker of its own under ``/engines/{id}``, the fit is checked against what every engine
there holds (the refusal names both numbers), and a release removes it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from tests import waiting
from tests.worker.fakes import World, agent_client, assign_body, ready, wait_state
from thaw.units import GiB

PACKING = {"capacity_bytes": 8 * GiB}


def pack_body(engine_id: str, memory_gib: float, **over: Any) -> dict[str, Any]:
    return assign_body(assignment_id=f"a-{engine_id}", engine_id=engine_id, memory_bytes=int(memory_gib * GiB),
                       model="tuned", uri="s3://thaw/models/tuned", served_model_name="tuned", **over)


async def until(c: httpx.AsyncClient, path: str, pred: Any, timeout_s: float = 5.0) -> httpx.Response:
    last: list[httpx.Response] = []

    async def answered() -> list[httpx.Response] | None:
        last[:] = [await c.get(path)]
        return last if pred(last[0]) else None

    await waiting.until(f"{path} as wanted", answered, timeout_s, interval_s=0.005,
                        detail=lambda: f"{path}: {last[0].status_code} {last[0].text}")
    return last[0]


async def test_a_packed_engine_is_a_worker_of_its_own(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, settings=PACKING) as c:
        await ready(c, memory_bytes=3 * GiB)
        r = await c.post("/engines", json=pack_body("w1.e1", 3))
        assert r.status_code == 202, r.text
        st = r.json()
        assert st["worker_id"] == "w1.e1" and st["host_worker_id"] == "w1" and st["model"] == "tuned"
        assert st["control_url"].endswith("/engines/w1.e1") and st["memory_bytes"] == 3 * GiB
        st = (await until(c, "/engines/w1.e1/state", lambda r: r.json()["state"] == "ready")).json()
        # Its own engine host: the spare the worker kept imported (hosts[1]); the worker's
        # own is still serving, and the next spare started (hosts[2]).
        assert len(world.hosts) == 3 and world.hosts[1].launches and not world.hosts[2].launched
        assert st["engine_url"] and st["assignment_id"] == "a-w1.e1"
        own = (await c.get("/state")).json()
        assert own["state"] == "ready" and own["engines"] == ["w1.e1"] and own["capacity_bytes"] == 8 * GiB
        # The same engine id again (a retried call) is the same engine.
        again = await c.post("/engines", json=pack_body("w1.e1", 3))
        assert again.status_code == 202 and len(world.hosts) == 3


async def test_an_engine_that_does_not_fit_is_refused_naming_both_numbers(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, settings=PACKING) as c:
        await ready(c, memory_bytes=3 * GiB)
        assert (await c.post("/engines", json=pack_body("w1.e1", 3))).status_code == 202
        r = await c.post("/engines", json=pack_body("w1.e2", 2.5))
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert "needs 2.50 GiB" in error and "2.00 GiB are free" in error and "of 8.00 GiB" in error, error
        assert (await c.get("/engines/w1.e2/state")).status_code == 404
        assert (await c.get("/state")).json()["engines"] == ["w1.e1"]


async def test_a_worker_that_does_not_pack_refuses(tmp_path: Path) -> None:
    async with agent_client(World(), tmp_path) as c:
        await ready(c)
        r = await c.post("/engines", json=pack_body("w1.e1", 1))
        assert r.status_code == 409 and "does not pack" in r.json()["error"]
        r = await c.post("/engines", json=assign_body(engine_id="w1.e1"))
        assert r.status_code == 409 and "memory_bytes" in r.json()["error"]


async def test_a_released_engine_goes_away_and_its_room_comes_back(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, settings=PACKING) as c:
        await ready(c, memory_bytes=3 * GiB)
        assert (await c.post("/engines", json=pack_body("w1.e1", 5))).status_code == 202
        await until(c, "/engines/w1.e1/state", lambda r: r.json()["state"] == "ready")
        assert (await c.post("/engines", json=pack_body("w1.e2", 1))).status_code == 409
        r = await c.post("/engines/w1.e1/release", json={"drain_timeout_s": 1})
        assert r.status_code == 202 and r.json()["state"] == "draining"
        await until(c, "/engines/w1.e1/state", lambda r: r.status_code == 404)
        assert (await c.get("/state")).json()["engines"] == []
        # Its engine host was stopped, and no other started for it (hosts[2] is the spare).
        assert len(world.hosts) == 3 and world.hosts[1].returncode is not None
        assert world.hosts[2].returncode is None and not world.hosts[2].launched
        # The worker's own engine kept serving through it.
        assert (await c.get("/state")).json()["state"] == "ready"
        assert (await c.post("/engines", json=pack_body("w1.e2", 5))).status_code == 202


async def test_a_failed_packed_engine_is_released_without_a_new_host(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path, settings=PACKING) as c:
        await ready(c, memory_bytes=3 * GiB)
        world.on_launch = "crash"
        assert (await c.post("/engines", json=pack_body("w1.e1", 1))).status_code == 202
        st = (await until(c, "/engines/w1.e1/state", lambda r: r.json()["state"] == "failed")).json()
        assert "exited with status 1" in st["error"]
        await asyncio.sleep(0.05)  # quiet: no restart of a packed engine's host (hosts[2]: the next spare)
        assert len(world.hosts) == 3
        assert (await c.post("/engines/w1.e1/release", json={})).status_code == 202
        await until(c, "/engines/w1.e1/state", lambda r: r.status_code == 404)
        await wait_state(c, "ready")


async def test_a_packed_engine_takes_the_spare_host_even_before_it_imported(tmp_path: Path) -> None:
    """The spare's "imported" came before the handover (replayed to its new owner) or
    comes after it (passed on); either way the packed engine launches on it."""
    world = World()
    async with agent_client(world, tmp_path, settings=PACKING) as c:
        await ready(c, memory_bytes=1 * GiB)
        world.import_on_spawn = False  # the next spare will not have imported when taken
        assert (await c.post("/engines", json=pack_body("w1.e1", 1))).status_code == 202
        await until(c, "/engines/w1.e1/state", lambda r: r.json()["state"] == "ready")
        assert world.hosts[1].launches  # the first spare, imported before the handover
        assert (await c.post("/engines", json=pack_body("w1.e2", 1))).status_code == 202
        spare = world.hosts[2]
        assert not spare.launched
        spare.emit("imported")
        await until(c, "/engines/w1.e2/state", lambda r: r.json()["state"] == "ready")
        assert spare.launches and len(world.hosts) == 4


async def test_a_worker_that_does_not_pack_keeps_no_spare(tmp_path: Path) -> None:
    world = World()
    async with agent_client(world, tmp_path) as c:
        await ready(c)
        assert len(world.hosts) == 1


async def test_nothing_is_packed_beside_an_engine_of_unknown_memory(tmp_path: Path) -> None:
    async with agent_client(World(), tmp_path, settings=PACKING) as c:
        await ready(c)  # assigned with no memory_bytes
        r = await c.post("/engines", json=pack_body("w1.e1", 1))
        assert r.status_code == 409 and "is not known: nothing is packed beside it" in r.json()["error"]
