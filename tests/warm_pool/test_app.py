"""The controller's app (warm_pool.app): a malformed request's 422 in the error shape,
and an admin key admitted on the model and tenant API only."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.warm_pool.in_process import TOKEN, registry_config
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl


async def test_a_malformed_request_names_each_fields_problem(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path)
    app = create_pool_app(m, TOKEN, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        r = await c.post("/v1/demand", json={})
        assert r.status_code == 422 and r.json() == {"error": "invalid request: models: Field required"}
        r = await c.post("/v1/demand", json={"models": []})
        assert r.status_code == 422 and "models: List should have at least 1 item" in r.json()["error"]


async def test_a_demand_signal_names_many_models_and_says_which_are_unknown(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path)
    app = create_pool_app(m, TOKEN, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        served = m.cfg.models[0]
        r = await c.post("/v1/demand", json={"models": [served.resolved_served_name, "gone", served.name]})
        assert r.status_code == 202 and r.json() == {"accepted": 1, "unknown": ["gone"]}
        assert set(m.traffic.demand_at) == {served.name}  # by its served name too: one model
        r = await c.post("/v1/demand", json={"models": ["gone", "never"]})
        assert r.status_code == 404 and r.json()["error"] == "unknown models 'gone', 'never'"


async def test_an_admin_key_opens_the_registry_and_the_consoles_reads_and_nothing_else(tmp_path: Path) -> None:
    m = build_pool(registry_config(), {}, HttpWorkerControl(TOKEN), state_dir=tmp_path)
    admin = await m.parts.key_admin.add_admin("ops", "test")
    app = create_pool_app(m, TOKEN, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c",
                                 headers={"Authorization": f"Bearer {admin.key}"}) as c:
        assert (await c.get("/v1/admin/models")).status_code == 200
        assert (await c.get("/v1/keys")).status_code == 401
        assert (await c.get("/v1/routes")).status_code == 401
        assert (await c.get("/v1/pool/budget")).status_code == 401
        assert (await c.get("/v1/events")).status_code == 200  # the console reads these two
        assert (await c.get("/v1/state")).status_code == 200
