"""Tenants at run time, through the controller's manager: created, limited, allowed
models, removed (their keys, stored responses and conversations with them), each change in the catalog activators fetch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import FakeStoreReader, registry_config
from thaw.wire import ModelDeploy, ModelSpec, TenantChange, TenantCreate
from warm_pool.assembly import build_pool
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager
from warm_pool.registry.admin import UnknownTenant
from warm_pool.registry.models import RegistryRefused


def manager(db: Db, state_dir: Path | None = None) -> PoolManager:
    return build_pool(registry_config(), {}, HttpWorkerControl(None), state_dir=state_dir,
                      store_reader=FakeStoreReader(), state_db=db)


async def test_a_tenant_made_at_run_time_gets_keys_limits_and_models(tmp_path: Path, state_db: StateDb) -> None:
    m = manager(state_db(), tmp_path)
    version = m.parts.model_admin.catalog().version
    rec = await m.parts.tenant_admin.create(TenantCreate(name="beta", allowed_models=["demo"],
                                                         limits={"requests_per_minute": 60}), "ops")
    assert rec.who == "ops" and rec.limits.requests_per_minute == 60
    catalog = m.parts.model_admin.catalog()
    assert catalog.version == version + 1 and sorted(t.name for t in catalog.tenants) == ["acme", "beta", "demo"]
    key = await m.parts.key_admin.add("beta", "ci", "ops")
    assert key.row.tenant == "beta"
    # Limits merge field by field; 0 lifts one.
    await m.parts.tenant_admin.change("beta", TenantChange(limits={"tokens_per_minute": 1000}), "ops")
    rec = await m.parts.tenant_admin.change("beta", TenantChange(limits={"requests_per_minute": 0}), "ops")
    assert rec.limits.model_dump() == {"requests_per_minute": None, "tokens_per_minute": 1000,
                                       "max_concurrent_requests": None}
    refusals = [
        (m.parts.tenant_admin.create(TenantCreate(name="beta"), "ops"), 409, "exists"),
        (m.parts.tenant_admin.create(TenantCreate(name="gamma", allowed_models=["nope"]), "ops"), 422, "['nope']"),
        (m.parts.tenant_admin.change("beta", TenantChange(), "ops"), 422, "nothing to change"),
        (m.parts.tenant_admin.change("nobody", TenantChange(allowed_models=["*"]), "ops"), 404, "no tenant"),
        (m.parts.tenant_admin.remove("nobody", "ops"), 404, "no tenant"),
    ]
    before = m.parts.model_admin.catalog()
    for call, status, says in refusals:
        with pytest.raises(RegistryRefused) as info:
            await call
        assert info.value.status == status and says in str(info.value)
    assert m.parts.model_admin.catalog() == before
    # Kept across a restart (the config file's tenants were only the seed).
    m.parts.model_admin.store.close()
    again = manager(state_db(), tmp_path)
    beta = next(t for t in again.parts.model_admin.catalog().tenants if t.name == "beta")
    assert beta.allowed_models == ["demo"] and beta.limits.tokens_per_minute == 1000


async def test_a_tenant_goes_with_its_keys_but_not_while_it_owns_models(state_db: StateDb) -> None:
    m = manager(state_db())
    await m.parts.tenant_admin.create(TenantCreate(name="beta"), "ops")
    key = await m.parts.key_admin.add("beta", None, "ops")
    await m.parts.model_admin.deploy(ModelDeploy(name="own", spec=ModelSpec.model_validate(
        {"uri": "s3://thaw/models/own", "shape": "cpu-local", "tenant": "beta"})), "ops")
    with pytest.raises(RegistryRefused) as info:
        await m.parts.tenant_admin.remove("beta", "ops")
    assert info.value.status == 409 and "owns models ['own']" in str(info.value)
    await m.parts.model_admin.remove("own", "ops")
    m.parts.responses.save("beta", {"id": "resp_beta1", "output": []}, [], replica=None, at=1.0)
    m.parts.responses.create_conversation("beta", "conv_beta1", {}, [], at=1.0)
    rec = await m.parts.tenant_admin.remove("beta", "ops")
    assert rec.removed_at is not None and "beta" not in {t.name for t in m.parts.model_admin.catalog().tenants}
    # Its stored responses and conversations went with it.
    assert m.parts.responses.get("beta", "resp_beta1") is None and m.parts.responses.conversation("beta", "conv_beta1") is None
    assert [k.revoked_at is not None for k in (await m.parts.key_admin.table()).keys if k.hash == key.row.hash] == [True]
    with pytest.raises(UnknownTenant):
        await m.parts.key_admin.add("beta", None, "ops")
    # Made again, it starts with no key.
    await m.parts.tenant_admin.create(TenantCreate(name="beta"), "ops")
    assert all(k.revoked_at is not None for k in (await m.parts.key_admin.table()).keys if k.tenant == "beta")
