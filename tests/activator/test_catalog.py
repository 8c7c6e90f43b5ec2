"""The catalog the controller sends (the models and tenants in force): a deployed model
is listed and served, a tenant's private model is another tenant's 404, a removed one
is 404 and its waiting requests are told so, and the last catalog holds across a
restart without the controller."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from activator.app import create_app
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import KEY, LIMITED_KEY, make_config, replica
from tests.waiting import until
from thaw.config import ThawConfig
from thaw.embedded_store import free_port
from thaw.wire import Catalog, RouteTable


def catalog(cfg: ThawConfig, version: int, *extra: dict[str, Any], drop: tuple[str, ...] = ()) -> Catalog:
    models = [m.model_dump(mode="json") for m in cfg.models if m.name not in drop]
    return Catalog.model_validate({"version": version, "models": [*models, *extra],
                                   "tenants": [t.model_dump(mode="json") for t in cfg.tenants]})


PRIVATE = {"name": "acme-chat", "uri": "s3://thaw/models/acme", "shape": "cpu-local", "tenant": "limited"}


def ids(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return sorted(m["id"] for m in r.json()["data"])


async def test_models_come_and_go_with_the_catalog(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="c1")
    routes = app.state.routes
    every, limited = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {LIMITED_KEY}"}
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        assert ids(await client.get("/v1/models", headers=every)) == ["other", "thaw-demo"]
        await routes.feed.followed["catalog"].on(catalog(cfg, 2, PRIVATE))
        # Private to "limited": listed and callable with its keys only, whatever "all" may use.
        assert ids(await client.get("/v1/models", headers=limited)) == ["acme-chat", "other"]
        assert ids(await client.get("/v1/models", headers=every)) == ["other", "thaw-demo"]
        hidden = await client.get("/v1/models/acme-chat", headers=every)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
        with serve(FakeEngine("acme")) as url:
            routes.apply(RouteTable.model_validate({"epoch": "e1", "version": 1, "catalog_version": 2, "models": {
                "acme-chat": {"served_name": "acme-chat", "replicas": [replica(url, assignment="acme-1")],
                              "loading": 0, "failures": 0}}}))
            body = {"model": "acme-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            ok = await client.post("/v1/chat/completions", json=body, headers=limited)
            assert ok.status_code == 200, ok.text
            refused = await client.post("/v1/chat/completions", json=body, headers=every)
            assert refused.status_code == 404
        # "other" removed: a request already waiting for it is told it no longer exists,
        # a new one is a 404 too.
        waiting = asyncio.create_task(client.post(
            "/v1/chat/completions", headers=every,
            json={"model": "other", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        await until("a request waiting for other", lambda: routes.status("other").cold_queue, 2)
        await routes.feed.followed["catalog"].on(catalog(cfg, 3, PRIVATE, drop=("other",)))
        gone = await waiting
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        assert ids(await client.get("/v1/models", headers=every)) == ["thaw-demo"]
        assert (await client.get("/v1/models/other", headers=every)).status_code == 404
    # A restart while the controller is away serves the catalog last received.
    again = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="c1")
    async with again.router.lifespan_context(again), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=again), base_url="http://act") as client:
        assert again.state.routes.feed.followed["catalog"].held == 3
        assert ids(await client.get("/v1/models", headers=limited)) == ["acme-chat"]
    assert (cfg.activator_dir("c1") / "catalog.json").stat().st_mode & 0o777 == 0o600


async def test_a_tenant_made_at_run_time_works_whichever_table_comes_first(tmp_path: Path) -> None:
    import hashlib

    from thaw.wire import ApiKey, KeyTable

    cfg = make_config(tmp_path)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="c2")
    routes = app.state.routes
    key = "thaw-run-time-tenant-key"
    keys = KeyTable(version=1, keys=[ApiKey(hash=hashlib.sha256(key.encode()).hexdigest(), tenant="beta",
                                            prefix=key[:9], created_at=1.0)])
    beta = {"name": "beta", "allowed_models": ["other"], "limits": {"requests_per_minute": 5}}
    with_beta = Catalog.model_validate({**catalog(cfg, 2).model_dump(mode="json"),
                                        "tenants": [*(t.model_dump(mode="json") for t in cfg.tenants), beta]})
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        # The key first: its tenant is not known yet, so it is refused.
        await routes.feed.followed["keys"].on(keys)
        assert (await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code == 401
        # Then the catalog with the tenant: the key works, with the tenant's models and limits.
        await routes.feed.followed["catalog"].on(with_beta)
        r = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert ids(r) == ["other"] and r.status_code == 200
        assert app.state.service.auth.authenticate(f"Bearer {key}").limits.requests_per_minute == 5
        # Removed from the catalog: refused again.
        await routes.feed.followed["catalog"].on(catalog(cfg, 3))
        assert (await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})).status_code == 401
