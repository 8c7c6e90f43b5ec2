"""`thaw apply`: the plan between what is in force and a file, checked whole, then
written all at once or not at all; a dry run changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import FakeStoreReader, registry_config
from thaw.wire import ApplyRequest
from warm_pool.assembly import build_pool
from warm_pool.db import Db
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager
from warm_pool.registry.models import RegistryRefused

DEMO = {"name": "demo", "uri": "s3://thaw/models/demo", "served_name": "thaw-demo", "max_context_tokens": 2048,
        "shape": "cpu-local", "engine": {"dtype": "auto", "enforce_eager": True, "cpu_kvcache_gib": 1}}


def manager(db: Db, reader: FakeStoreReader | None = None) -> PoolManager:
    return build_pool(registry_config(), {}, HttpWorkerControl(None), store_reader=reader or FakeStoreReader(),
                      state_db=db)


def request(models: list[dict[str, Any]] | None = None, tenants: list[dict[str, Any]] | None = None,
            dry_run: bool = False) -> ApplyRequest:
    return ApplyRequest.model_validate({"models": models, "tenants": tenants, "dry_run": dry_run})


def plan(reply: Any) -> list[tuple[str, str, str]]:
    return [(c.kind, c.name, c.action) for c in reply.changes]


async def test_apply_plans_deploys_updates_and_removals_and_writes_them_at_once(state_db: StateDb) -> None:
    m = manager(state_db())
    demo = m.cfg.model("demo")
    assert demo is not None
    same = {**DEMO, "engine": demo.engine.model_dump(mode="json"),
            "autoscaling": demo.autoscaling.model_dump(mode="json")}
    # What is in force already: nothing to do.
    assert (await m.parts.applier.apply(request([same]), "ops")).changes == []
    file = [{**same, "autoscaling": {**same["autoscaling"], "max_replicas": 3}},
            {"name": "chat", "uri": "s3://thaw/models/chat", "shape": "cpu-local", "tenant": "acme"},
            {"name": "tuned", "base": "chat", "adapter_uri": "s3://thaw/models/tuned"}]
    tenants = [{"name": "acme", "allowed_models": ["chat", "tuned"], "limits": {"requests_per_minute": 10}},
               {"name": "fresh"}]
    before = m.parts.model_admin.catalog()
    dry = await m.parts.applier.apply(request(file, tenants, dry_run=True), "ops")
    assert not dry.applied and m.parts.model_admin.catalog() == before
    assert plan(dry) == [("model", "demo", "update"), ("model", "chat", "deploy"), ("model", "tuned", "deploy"),
                         ("tenant", "acme", "change"), ("tenant", "fresh", "create"), ("tenant", "demo", "remove")]
    assert dry.changes[0].fields == {"autoscaling": [same["autoscaling"], file[0]["autoscaling"]]}
    done = await m.parts.applier.apply(request(file, tenants), "ops")
    assert done.applied and plan(done) == plan(dry) and done.version == before.version + 1
    assert [c.revision for c in done.changes if c.kind == "model"] == [2, 1, 1]
    catalog = m.parts.model_admin.catalog()
    assert sorted(x.name for x in catalog.models) == ["chat", "demo", "tuned"]
    assert sorted(t.name for t in catalog.tenants) == ["acme", "fresh"]
    assert m.cfg.model("demo").autoscaling.max_replicas == 3  # type: ignore[union-attr]
    # Applied again: nothing; a file without models leaves them alone; removing the rest.
    assert (await m.parts.applier.apply(request(file, tenants), "ops")).changes == []
    assert (await m.parts.applier.apply(request(tenants=tenants), "ops")).changes == []
    gone = await m.parts.applier.apply(request([file[0]], [{"name": "fresh"}]), "ops")
    assert plan(gone) == [("model", "chat", "remove"), ("model", "tuned", "remove"), ("tenant", "acme", "remove")]
    assert [x.name for x in m.parts.model_admin.catalog().models] == ["demo"]
    # Kept: a new controller on the same state serves what was applied.
    m.parts.model_admin.store.close()
    assert [x.name for x in manager(state_db()).parts.model_admin.catalog().models] == ["demo"]


async def test_weights_pushed_again_to_the_same_uri_are_a_change(state_db: StateDb) -> None:
    reader = FakeStoreReader()
    m = manager(state_db(), reader)
    demo = m.cfg.model("demo")
    assert demo is not None
    same = {**DEMO, "engine": demo.engine.model_dump(mode="json"),
            "autoscaling": demo.autoscaling.model_dump(mode="json")}
    # Seeded from the config file, its weights were never hashed: a first update does.
    same["autoscaling"]["max_replicas"] = 3
    assert plan(await m.parts.applier.apply(request([same]), "ops")) == [("model", "demo", "update")]
    assert (await m.parts.applier.apply(request([same]), "ops")).changes == []
    held = m.parts.model_admin.records["demo"].revisions[-1].weights_sha256
    assert held is not None
    reader.sizes["s3://thaw/models/demo"] = 65 * 2**20  # new weights, same URI: another manifest
    done = await m.parts.applier.apply(request([same]), "ops")
    assert plan(done) == [("model", "demo", "update")] and done.changes[0].revision == 3
    now = m.parts.model_admin.records["demo"].revisions[-1].weights_sha256
    assert done.changes[0].fields == {"weights_sha256": [held, now]} and now != held
    assert m.parts.model_admin.outdated() == {"demo": frozenset({1, 2})}  # replicas of earlier revisions roll
    assert (await m.parts.applier.apply(request([same]), "ops")).changes == []


@pytest.mark.parametrize(("models", "tenants", "says"), [
    ([DEMO, {"name": "x", "uri": "s3://thaw/models/x", "shape": "nope"}], None, "shape 'nope' is not declared"),
    ([DEMO, {"name": "x", "uri": "s3://thaw/models/missing", "shape": "cpu-local"}], None, "no manifest"),
    ([DEMO, {"name": "x", "uri": "s3://thaw/models/huge", "shape": "cpu-local"}], None, "do not fit"),
    ([DEMO, DEMO], None, "appears twice"),
    ([], [{"name": "demo", "allowed_models": ["demo"]}], "would not be deployed"),  # a tenant of a model removed
    (None, [{"name": "t", "allowed_models": ["nope"]}], "would not be deployed"),
    ([{**DEMO, "tenant": "gone"}], None, "tenant 'gone' is not declared"),
])
async def test_a_refused_apply_changes_nothing(models: list[dict[str, Any]] | None,
                                               tenants: list[dict[str, Any]] | None, says: str,
                                               state_db: StateDb) -> None:
    reader = FakeStoreReader(sizes={"s3://thaw/models/missing": None, "s3://thaw/models/huge": 40 * 2**30})  # type: ignore[dict-item]
    m = manager(state_db(), reader)
    before = (m.parts.model_admin.catalog(), m.parts.model_admin.list())
    with pytest.raises(RegistryRefused) as info:
        await m.parts.applier.apply(request(models, tenants), "ops")
    assert says in str(info.value), str(info.value)
    assert (m.parts.model_admin.catalog(), m.parts.model_admin.list()) == before


@pytest.mark.parametrize("first", ["missing", "huge"])
async def test_the_store_checks_run_at_once_and_the_first_refused_in_the_file_is_named(
        first: str, state_db: StateDb) -> None:
    reader = FakeStoreReader(sizes={"s3://thaw/models/missing": None, "s3://thaw/models/huge": 40 * 2**30})  # type: ignore[dict-item]
    m = manager(state_db(), reader)
    others = [{"name": f"ok{i}", "uri": f"s3://thaw/models/ok{i}", "shape": "cpu-local"} for i in range(40)]
    second = "huge" if first == "missing" else "missing"
    models = [DEMO, *others[:20], {"name": "a", "uri": f"s3://thaw/models/{first}", "shape": "cpu-local"},
              *others[20:], {"name": "b", "uri": f"s3://thaw/models/{second}", "shape": "cpu-local"}]
    with pytest.raises(RegistryRefused) as info:
        await m.parts.applier.apply(request(models), "ops")
    assert ("no manifest" if first == "missing" else "do not fit") in str(info.value), str(info.value)
    # Every model's weights were read, the refused ones too, whatever the order they came back in.
    assert len(reader.checked) == len(models)
    done = await m.parts.applier.apply(request([DEMO, *others]), "ops")
    assert [c.name for c in done.changes] == [m["name"] for m in [DEMO, *others]]  # the file's order
