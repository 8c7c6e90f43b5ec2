"""The model registry: deploys, updates, rollbacks and removals, each checked before it
is accepted, kept as immutable revisions in SQLite, and the config in force they make."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import EXAMPLE, FakeStoreReader, registry_config
from thaw.config import ThawConfig, parse_config
from thaw.units import GiB
from thaw.wire import ModelDeploy, ModelRollback, ModelSpec, ModelUpdate
from warm_pool.db import Db
from warm_pool.events import EventLog
from warm_pool.registry.models import ModelRegistry, RegistryRefused
from warm_pool.registry.store import RegistryStore, StaleRevision


class Registry:
    """A registry over one SQLite file, the changes it told the controller about."""

    def __init__(self, db: Db, cfg: ThawConfig | None = None, reader: FakeStoreReader | None = None) -> None:
        self.changes: list[ThawConfig] = []
        self.reader = reader if reader is not None else FakeStoreReader()
        self.clock = 1000.0

        async def on_change(cfg: ThawConfig) -> None:
            self.changes.append(cfg)

        self.r = ModelRegistry(cfg or registry_config(), RegistryStore(db), self.reader, EventLog(lambda: self.clock),
                               on_change=on_change, clock=lambda: self.clock)


def spec(**fields: Any) -> ModelSpec:
    return ModelSpec.model_validate(fields)


def deploy(name: str, **fields: Any) -> ModelDeploy:
    return ModelDeploy(name=name, spec=spec(**fields))


async def test_the_config_seeds_a_new_registry_once(state_db: StateDb) -> None:
    first = Registry(state_db()).r
    assert [m.name for m in first.cfg.models] == ["demo"]
    rec = first.describe("demo")
    assert rec.revision == 1 and rec.revisions[0].change == "import" and rec.revisions[0].who == "config"
    await first.deploy(deploy("extra", uri="s3://thaw/models/extra", shape="cpu-local"), "op")
    await first.remove("demo", "op")
    first.store.close()
    # A restart with another file: the registry, not the file, says what is served.
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["name"] = "renamed"
    again = Registry(state_db(), parse_config({**data, "data_dir": "/tmp/unused"})).r
    assert [m.name for m in again.cfg.models] == ["extra"]
    assert again.describe("demo").revision is None and len(again.describe("demo").revisions) == 1


async def test_a_deploy_is_served_and_outlives_a_restart(state_db: StateDb) -> None:
    reg = Registry(state_db())
    before = reg.r.version
    rec = await reg.r.deploy(ModelDeploy(name="chat", spec=spec(
        uri="s3://thaw/models/chat", shape="cpu-local", served_name="chat-v1", tenant="acme",
        autoscaling={"min_replicas": 0, "max_replicas": 2, "idle_grace_s": 30},
        engine={"cpu_kvcache_gib": 0.5, "extra": {"max_num_seqs": 8}}), note="launch"), "alice@host")
    assert rec.revision == 1 and reg.r.version == before + 1
    rev = rec.revisions[0]
    assert rev.who == "alice@host" and rev.change == "deploy" and rev.note == "launch"
    assert rev.weights_bytes == 64 * 2**20 and rev.weights_sha256 and len(rev.weights_sha256) == 64
    m = reg.changes[-1].model("chat-v1")
    assert m is not None and m.tenant == "acme" and m.autoscaling.max_replicas == 2
    assert m.engine.cpu_kvcache_gib == 0.5 and m.engine.extra == {"max_num_seqs": 8}
    assert reg.reader.checked == ["s3://thaw/models/chat"]
    reg.r.store.close()
    again = Registry(state_db()).r
    assert again.cfg.model("chat") == m and again.describe("chat") == rec


@pytest.mark.parametrize(("fields", "status", "says"), [
    ({"uri": "s3://thaw/models/x", "shape": "gpu-huge"}, 422, "shape 'gpu-huge' is not declared"),
    ({"uri": "s3://thaw/elsewhere/x", "shape": "cpu-local"}, 422, "outside the allowed prefixes"),
    ({"uri": "s3://thaw/models/x", "shape": "cpu-local", "tenant": "nobody"}, 422, "tenant 'nobody' is not declared"),
    ({"base": "nothing", "adapter_uri": "s3://thaw/models/a"}, 422, "base 'nothing' is not a model"),
    ({"uri": "s3://thaw/models/missing", "shape": "cpu-local"}, 422, "uri: no manifest"),
    ({"uri": "s3://thaw/models/huge", "shape": "cpu-local"}, 422, "do not fit shape 'cpu-local'"),
    ({"uri": "s3://thaw/models/x", "shape": "cpu-local", "served_name": "thaw-demo"}, 422,
     "share the served name 'thaw-demo'"),
    ({"uri": "s3://thaw/models/x"}, 422, "model 'new': shape: Field required"),
])
async def test_a_refused_deploy_says_why_and_changes_nothing(
        fields: dict[str, Any], status: int, says: str, state_db: StateDb) -> None:
    reader = FakeStoreReader(sizes={"s3://thaw/models/missing": None, "s3://thaw/models/huge": 40 * GiB})  # type: ignore[dict-item]
    reg = Registry(state_db(), reader=reader)
    before = (reg.r.version, reg.r.list(), reg.r.cfg)
    with pytest.raises(RegistryRefused) as info:
        await reg.r.deploy(deploy("new", **fields), "op")
    assert info.value.status == status and says in str(info.value), str(info.value)
    assert (reg.r.version, reg.r.list(), reg.r.cfg) == before and reg.changes == []


async def test_a_name_in_use_is_a_conflict_and_without_the_store_nothing_is_deployed(state_db: StateDb) -> None:
    reg = Registry(state_db())
    for name in ("demo", "thaw-demo"):  # a model's name, or another model's served name
        with pytest.raises(RegistryRefused) as info:
            await reg.r.deploy(deploy(name, uri="s3://thaw/models/x", shape="cpu-local"), "op")
        assert info.value.status == 409
    blind = ModelRegistry(registry_config(), RegistryStore(Db.sqlite(None)), None, EventLog(lambda: 0.0),
                          on_change=reg.r._on_change, clock=lambda: 0.0)
    with pytest.raises(RegistryRefused) as info:
        await blind.deploy(deploy("x", uri="s3://thaw/models/x", shape="cpu-local"), "op")
    assert info.value.status == 503 and "cannot reach the object store" in str(info.value)


async def test_an_update_merges_settings_into_a_new_revision_and_a_stale_one_is_refused(state_db: StateDb) -> None:
    reg = Registry(state_db())
    r1 = reg.r.describe("demo")
    r2 = await reg.r.update("demo", ModelUpdate(revision=1, spec=spec(
        uri="s3://thaw/models/demo-v2", autoscaling={"max_replicas": 3})), "op")
    assert r2.revision == 2 and r2.revisions[0] == r1.revisions[0]
    m = reg.r.cfg.model("demo")
    assert m is not None and m.uri == "s3://thaw/models/demo-v2" and m.autoscaling.max_replicas == 3
    # Settings not named are the previous revision's.
    assert m.autoscaling.idle_grace_s == parse_config(yaml.safe_load(EXAMPLE.read_text())).models[0].autoscaling.idle_grace_s
    for body, says in ((ModelUpdate(revision=1, spec=spec(autoscaling={"max_replicas": 4})), "at revision 2, not 1"),
                       (ModelUpdate(revision=2, spec=spec()), "nothing to change"),
                       (ModelUpdate(revision=2, spec=spec(autoscaling={"max_replicas": 3})), "already has")):
        with pytest.raises(RegistryRefused) as info:
            await reg.r.update("demo", body, "op")
        assert says in str(info.value)
    with pytest.raises(RegistryRefused) as info:
        await reg.r.update("nope", ModelUpdate(revision=1, spec=spec(max_context_tokens=8)), "op")
    assert info.value.status == 404
    assert reg.r.describe("demo").revision == 2


async def test_a_rollback_is_a_new_revision_with_an_earlier_ones_settings(state_db: StateDb) -> None:
    reg = Registry(state_db())
    await reg.r.update("demo", ModelUpdate(revision=1, spec=spec(uri="s3://thaw/models/demo-v2")), "op")
    await reg.r.update("demo", ModelUpdate(revision=2, spec=spec(uri="s3://thaw/models/demo-v3")), "op")
    rec = await reg.r.rollback("demo", ModelRollback(), "op")
    assert rec.revision == 4 and rec.revisions[-1].from_revision == 2 and rec.revisions[-1].change == "rollback"
    assert reg.r.cfg.model("demo").uri == "s3://thaw/models/demo-v2"  # type: ignore[union-attr]
    rec = await reg.r.rollback("demo", ModelRollback(to=1, revision=4), "op")
    assert reg.r.cfg.model("demo").uri == "s3://thaw/models/demo"  # type: ignore[union-attr]
    for body, status in ((ModelRollback(to=9), 404), (ModelRollback(to=5), 409), (ModelRollback(to=1, revision=3), 409)):
        with pytest.raises(RegistryRefused) as info:
            await reg.r.rollback("demo", body, "op")
        assert info.value.status == status
    assert [r.revision for r in reg.r.describe("demo").revisions] == [1, 2, 3, 4, 5]


async def test_a_removal_keeps_the_revisions_and_a_base_goes_only_after_its_adapters(state_db: StateDb) -> None:
    reg = Registry(state_db())
    await reg.r.deploy(deploy("tuned", base="demo", adapter_uri="s3://thaw/models/tuned"), "op")
    assert reg.r.cfg.model("tuned").shape == "cpu-local"  # type: ignore[union-attr]  # its base's
    with pytest.raises(RegistryRefused) as info:
        await reg.r.remove("demo", "op")
    assert info.value.status == 409 and "base of adapters ['tuned']" in str(info.value)
    with pytest.raises(RegistryRefused) as info:
        await reg.r.remove("tuned", "op", revision=7)
    assert info.value.status == 409
    rec = await reg.r.remove("tuned", "bob")
    assert rec.revision is None and rec.removed_by == "bob" and len(rec.revisions) == 1
    assert reg.r.cfg.model("tuned") is None
    with pytest.raises(RegistryRefused) as info:
        await reg.r.remove("tuned", "op")
    assert info.value.status == 404
    # Deployed again, it goes on from its last revision.
    again = await reg.r.deploy(deploy("tuned", base="demo", adapter_uri="s3://thaw/models/tuned-2"), "op")
    assert again.revision == 2 and [r.change for r in again.revisions] == ["deploy", "deploy"]


async def test_of_two_changes_based_on_one_revision_the_second_is_refused(state_db: StateDb) -> None:
    # Two registries over one database, as two controllers would be.
    a, b = Registry(state_db()).r, Registry(state_db()).r
    await a.update("demo", ModelUpdate(revision=1, spec=spec(max_context_tokens=1024)), "a")
    with pytest.raises(RegistryRefused) as info:
        await b.update("demo", ModelUpdate(revision=1, spec=spec(max_context_tokens=512)), "b")
    assert info.value.status == 409
    store = RegistryStore(state_db())
    with pytest.raises(StaleRevision):
        store.remove("demo", 1, 0.0, "c")
    assert [r.revision for r in store.records()[0].revisions] == [1, 2]


async def test_a_change_of_prices_or_scaling_is_a_revision_that_rolls_nothing(state_db: StateDb) -> None:
    reg = Registry(state_db())
    await reg.r.update("demo", ModelUpdate(revision=1, spec=spec(pricing={"prompt_usd_per_mtok": 0.5})), "op")
    await reg.r.update("demo", ModelUpdate(revision=2, spec=spec(pricing={"completion_usd_per_mtok": 2},
                                                                 autoscaling={"max_replicas": 2})), "op")
    m = reg.r.cfg.model("demo")
    assert m is not None and m.pricing is not None
    assert (m.pricing.prompt_usd_per_mtok, m.pricing.completion_usd_per_mtok) == (0.5, 2)
    # A pre-warm schedule is a setting too; an update replaces the whole schedule.
    await reg.r.update("demo", ModelUpdate(revision=3, spec=spec(prewarm=[{"cron": "0 9 * * *", "for_s": 60},
                                                                          {"cron": "0 12 * * *", "for_s": 60}])), "op")
    await reg.r.update("demo", ModelUpdate(revision=4, spec=spec(prewarm=[{"cron": "0 8 * * 1-5", "for_s": 600}])),
                       "op")
    m = reg.r.cfg.model("demo")
    assert m is not None and [(w.cron, w.for_s) for w in m.prewarm] == [("0 8 * * 1-5", 600.0)]
    assert reg.r.outdated() == {}
    await reg.r.update("demo", ModelUpdate(revision=5, spec=spec(uri="s3://thaw/models/demo-v2")), "op")
    assert reg.r.outdated() == {"demo": frozenset({1, 2, 3, 4, 5})}



async def test_what_a_roll_replaces_is_kept_across_changes_and_restarts(state_db: StateDb) -> None:
    reg = Registry(state_db())
    await reg.r.deploy(deploy("chat", uri="s3://thaw/models/chat", shape="cpu-local"), "op")
    await reg.r.update("chat", ModelUpdate(revision=1, spec=spec(uri="s3://thaw/models/chat-v2")), "op")
    before = reg.r.outdated()
    assert before == {"chat": frozenset({1})}
    await reg.r.update("demo", ModelUpdate(revision=1, spec=spec(uri="s3://thaw/models/demo-v2")), "op")
    assert reg.r.outdated() == {"chat": frozenset({1}), "demo": frozenset({1})}
    assert before == {"chat": frozenset({1})}  # a dict handed out is never changed under its holder
    await reg.r.remove("chat", "op")
    assert reg.r.outdated() == {"demo": frozenset({1})}
    reg.r.store.close()
    assert Registry(state_db()).r.outdated() == {"demo": frozenset({1})}
