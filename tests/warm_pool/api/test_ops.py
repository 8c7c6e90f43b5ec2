"""The operators' routes and what a follower answers (warm_pool.api.ops): liveness,
metrics and where the leader is answer on any controller; everything else on a
follower is a 503 that names the leader, before any credential is checked."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.warm_pool.in_process import TOKEN, registry_config
from thaw.controllers import LEADER_HEADER
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.leader import Lease, LeaseStore
from warm_pool.manager import PoolManager


def follower(root: Path) -> PoolManager:
    """A controller that shares its state database and has not taken the lease."""
    return build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=root,
                      state_db=Db.sqlite(root / "state.db"), lease=LeaseStore(Db.sqlite(root / "state.db")),
                      url="http://me", controller_id="me")


def client(m: PoolManager) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_pool_app(m, TOKEN, manage_lifecycle=False)),
                             base_url="http://c", headers={"Authorization": f"Bearer {TOKEN}"})


async def test_a_follower_with_no_leader_says_to_retry(tmp_path: Path) -> None:
    async with client(follower(tmp_path)) as c:
        r = await c.get("/v1/state", headers={"Authorization": "Bearer wrong"})  # no credential checked
        assert r.status_code == 503 and r.headers["x-thaw-role"] == "follower" and r.headers["retry-after"] == "1"
        assert LEADER_HEADER.lower() not in r.headers and "no controller leads now" in r.json()["error"]
        health = (await c.get("/healthz")).json()
        assert health["role"] == "follower" and health["leader"] is None and health["adopted"] is False
        leader = (await c.get("/v1/leader")).json()
        assert leader == {"controller": "me", "url": "http://me", "leading": False, "leader_url": None,
                          "term": None}


async def test_a_follower_names_the_leader(tmp_path: Path) -> None:
    m = follower(tmp_path)
    assert m.parts.leadership is not None
    m.parts.leadership.leader = Lease("other", "http://other", 3, 0.0)
    async with client(m) as c:
        r = await c.post("/v1/workers/heartbeat", json={})
        assert r.status_code == 503 and r.headers[LEADER_HEADER] == "http://other"
        assert r.json() == {"error": "this controller follows; the leader is at http://other",
                            "leader": "http://other"}
        assert (await c.get("/v1/leader")).json()["term"] == 3
        assert (await c.get("/metrics")).status_code == 200


async def test_the_only_controller_leads(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path, url="http://me",
                   controller_id="me", epoch="e1")
    async with client(m) as c:
        assert (await c.get("/healthz")).json() == {"ok": True, "epoch": "e1", "adopted": False,
                                                    "role": "leader", "leader": None, "routes_version": 0,
                                                    "catalog_version": 0}
        assert (await c.get("/v1/leader")).json() == {"controller": "me", "url": "http://me", "leading": True,
                                                      "leader_url": "http://me", "term": None}
