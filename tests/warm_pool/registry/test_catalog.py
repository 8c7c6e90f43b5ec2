"""The catalog activators fetch (warm_pool.registry.catalog): a watcher that holds a
version the controller has the changes of gets only the models changed since (and the
tenants, whole); any other gets the whole catalog, whose JSON is what it was before
deltas and made once per version."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import TOKEN, FakeStoreReader, registry_config
from thaw.config import Model
from thaw.wire import ApplyRequest, Catalog, ModelDeploy, ModelSpec, ModelUpdate, TenantChange
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager
from warm_pool.registry.catalog import CatalogFeed


def manager(db: Db) -> PoolManager:
    return build_pool(registry_config(), {}, HttpWorkerControl(None), store_reader=FakeStoreReader(), state_db=db)


def deploy(name: str, **fields: object) -> ModelDeploy:
    return ModelDeploy(name=name, spec=ModelSpec.model_validate(
        fields or {"uri": f"s3://thaw/models/{name}", "shape": "cpu-local"}))


def by_name(c: Catalog) -> dict[str, Model]:
    return {m.name: m for m in c.models}


def merged_equals_whole(held: Catalog, delta: Catalog, whole: Catalog) -> None:
    out = held.merged(delta)
    assert out is not None and out.version == whole.version and out.base_version is None and out.removed == []
    assert by_name(out) == by_name(whole) and out.tenants == whole.tenants


async def test_a_watcher_within_the_history_gets_only_the_models_changed(state_db: StateDb) -> None:
    m = manager(state_db())
    reg = m.parts.model_admin
    held = reg.catalog()
    await reg.deploy(deploy("chat"), "op")
    one = reg.catalog()
    await reg.deploy(deploy("tuned", base="chat", adapter_uri="s3://thaw/models/tuned"), "op")
    await reg.deploy(deploy("other"), "op")
    d = reg.catalogs.answer(held.version, delta=True)
    assert (d.base_version, d.version, sorted(by_name(d)), d.removed) == (held.version, held.version + 3,
                                                                          ["chat", "other", "tuned"], [])
    merged_equals_whole(held, d, reg.catalog())
    # Only the models changed since the watcher's version (not "chat", deployed before it).
    assert sorted(by_name(reg.catalogs.answer(one.version, delta=True))) == ["other", "tuned"]
    # A base changed: its adapter (built from it) comes with it.
    two = reg.catalog()
    rec = reg.describe("chat")
    assert rec.revision is not None
    await reg.update("chat", ModelUpdate(revision=rec.revision, spec=ModelSpec.model_validate(
        {"max_context_tokens": 1024})), "op")
    d = reg.catalogs.answer(two.version, delta=True)
    assert sorted(by_name(d)) == ["chat", "tuned"] and by_name(d)["tuned"].max_context_tokens == 1024
    merged_equals_whole(two, d, reg.catalog())
    # Nothing changed since the current version: an empty delta.
    now = reg.catalog()
    d = reg.catalogs.answer(now.version, delta=True)
    assert (d.base_version, d.models, d.removed) == (now.version, [], [])


async def test_a_removed_model_is_named_and_the_tenants_come_whole(state_db: StateDb) -> None:
    m = manager(state_db())
    reg = m.parts.model_admin
    await reg.deploy(deploy("chat"), "op")
    await m.parts.tenant_admin.change("acme", TenantChange(allowed_models=["chat"]), "op")
    held = reg.catalog()
    await reg.remove("chat", "op")
    d = reg.catalogs.answer(held.version, delta=True)
    assert (d.models, d.removed) == ([], ["chat"])
    # Removing it took it from acme's allowed_models: the tenants are whole, as in force.
    assert d.tenants == reg.catalog().tenants and next(t for t in d.tenants if t.name == "acme").allowed_models == []
    merged_equals_whole(held, d, reg.catalog())
    # A tenant's change alone: no model changed.
    held = reg.catalog()
    await m.parts.tenant_admin.change("demo", TenantChange(limits={"requests_per_minute": 5}), "op")
    d = reg.catalogs.answer(held.version, delta=True)
    assert d.models == [] and d.removed == [] and d.tenants == reg.catalog().tenants != held.tenants
    merged_equals_whole(held, d, reg.catalog())


async def test_the_whole_catalog_for_a_first_fetch_an_unknown_or_too_old_version(state_db: StateDb) -> None:
    m = manager(state_db())
    reg = m.parts.model_admin
    held = reg.catalog()
    await reg.deploy(deploy("chat"), "op")
    whole = reg.catalog()
    assert reg.catalogs.answer(-1, delta=True) is whole  # a first fetch
    assert reg.catalogs.answer(held.version) is whole  # a watcher that does not merge deltas
    assert reg.catalogs.answer(whole.version + 1, delta=True) is whole  # ahead of this controller
    # A history of two versions: a watcher three versions back gets the whole catalog.
    reg.catalogs = CatalogFeed(whole.version, reg.cfg, history=2)
    for name in ("a", "b", "c"):
        await reg.deploy(deploy(name), "op")
    assert reg.catalogs.answer(whole.version, delta=True) is reg.catalog()
    d = reg.catalogs.answer(whole.version + 1, delta=True)
    assert (d.base_version, sorted(by_name(d))) == (whole.version + 1, ["b", "c"])


async def test_a_registry_read_anew_has_no_history(state_db: StateDb, tmp_path: Path) -> None:
    db = Db.sqlite(tmp_path / "state.db")
    m = manager(db)
    reg = m.parts.model_admin
    held = reg.catalog()
    await reg.deploy(deploy("chat"), "op")
    # Another start, and a controller that starts leading: no change before their read is known.
    again = manager(Db.sqlite(tmp_path / "state.db")).parts.model_admin
    assert again.catalogs.answer(held.version, delta=True) is again.catalog()
    assert by_name(again.catalog()) == by_name(reg.catalog())
    await reg.refresh()
    assert reg.catalogs.answer(held.version, delta=True) is reg.catalog()
    await reg.deploy(deploy("other"), "op")  # a change after the read is
    assert sorted(by_name(reg.catalogs.answer(reg.version - 1, delta=True))) == ["other"]
    # `thaw apply` reads every model anew.
    before = reg.catalog()
    req = ApplyRequest.model_validate({"models": [{"name": "chat", "uri": "s3://thaw/models/chat",
                                                   "shape": "cpu-local"}]})
    assert (await m.parts.applier.apply(req, "ops")).applied
    assert reg.catalogs.answer(before.version, delta=True) is reg.catalog() and [x.name for x in reg.catalog().models] \
        == ["chat"]


async def test_the_route_answers_deltas_and_whole_catalogs_as_before(state_db: StateDb) -> None:
    m = manager(state_db())
    reg = m.parts.model_admin
    held = reg.catalog()
    await reg.deploy(deploy("chat"), "op")
    app = create_pool_app(m, TOKEN, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        whole = await c.get("/v1/catalog")
        assert whole.status_code == 200 and set(whole.json()) == {"version", "models", "tenants"}
        assert Catalog.model_validate_json(whole.content) == reg.catalog()
        d = await c.get("/v1/catalog", params={"since": held.version, "delta": "true"})
        body = json.loads(d.content)
        assert body["base_version"] == held.version and [x["name"] for x in body["models"]] == ["chat"]
        merged_equals_whole(held, Catalog.model_validate_json(d.content), reg.catalog())
    # The whole catalog's JSON is made once per version.
    assert reg.catalogs.body(-1) is reg.catalogs.body(-1)
