"""The catalog the controller sends (the models and tenants in force): a deployed model
is listed and served, a tenant's private model is another tenant's 404, a removed one
is 404 and its waiting requests are told so, whole or in a delta, and the last catalog
holds across a restart without the controller."""

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
from warm_pool.registry.catalog import CatalogFeed


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


async def test_a_delta_changes_only_the_models_it_names_and_the_whole_catalog_is_kept(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    app = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="c3")
    routes = app.state.routes
    followed = routes.feed.followed["catalog"]
    every = {"Authorization": f"Bearer {KEY}"}
    # The controller's side: version 2 holds the config's models, 3 adds a private one.
    held = catalog(cfg, 2)
    controller = CatalogFeed(2, cfg.model_copy(update={"models": held.models}))
    added = catalog(cfg, 3, PRIVATE)
    controller.changed(3, cfg.model_copy(update={"models": [*held.models, added.models[-1]]}))
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as client:
        await followed.on(held, held)
        delta = controller.answer(2, delta=True)
        assert [m.name for m in delta.models] == ["acme-chat"]
        merged = held.merged(delta)
        assert merged is not None
        await followed.on(merged, delta)
        assert "acme-chat" in routes.model_names() and routes.models["acme-chat"] == added.models[-1]
        # "other" removed by a delta: a request waiting for it is told it no longer exists.
        waiting = asyncio.create_task(client.post(
            "/v1/chat/completions", headers=every,
            json={"model": "other", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        await until("a request waiting for other", lambda: routes.status("other").cold_queue, 2)
        controller.changed(4, cfg.model_copy(update={"models": [m for m in merged.models if m.name != "other"]}))
        delta = controller.answer(3, delta=True)
        assert (delta.models, delta.removed) == ([], ["other"])
        last = merged.merged(delta)
        assert last is not None
        await followed.on(last, delta)
        gone = await waiting
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        assert sorted(routes.models) == ["acme-chat", "demo"]
        assert ids(await client.get("/v1/models", headers=every)) == ["thaw-demo"]
    # What is kept on disk is the whole catalog, its JSON as the controller's.
    kept = (cfg.activator_dir("c3") / "catalog.json").read_bytes()
    assert kept == controller.catalog().body() and Catalog.model_validate_json(kept) == last
    # A restart holds it: the next fetch asks for a delta from its version.
    again = create_app(cfg, f"http://127.0.0.1:{free_port()}", activator_id="c3")
    f = again.state.routes.feed.followed["catalog"]
    assert f.held == 4 and f.table == last and f.params() == {"since": 4, "delta": "true"}
