"""A model deployed on a CPU shape runs eager unless it says otherwise: a compiled CPU
engine's cold start (~110 s at 256 MiB) nears the default activation_timeout_s (120 s).
The same default for `thaw models deploy`, ``POST /v1/admin/models`` and `thaw apply`;
the config file's models keep their meaning."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.warm_pool.conftest import StateDb
from tests.warm_pool.in_process import EXAMPLE, FakeStoreReader, registry_config
from thaw.config import ThawConfig
from thaw.wire import ApplyRequest, ModelDeploy, ModelSpec
from warm_pool.assembly import build_pool
from warm_pool.db import Db
from warm_pool.events import EventLog
from warm_pool.fleet.control import HttpWorkerControl
from warm_pool.manager import PoolManager
from warm_pool.registry.in_force import current_spec
from warm_pool.registry.models import ModelRegistry, eager_on_cpu
from warm_pool.registry.store import RegistryStore


def with_gpu_shape() -> ThawConfig:
    shapes = yaml.safe_load(EXAMPLE.read_text())["shapes"]
    return registry_config(shapes=[*shapes, {"name": "gpu-1", "gpu_type": "l4-24gb", "gpu_count": 1,
                                             "gpu_memory_gib": 24, "host_memory_gib": 32,
                                             "price_per_hour_usd": 0.8}])


CPU = {"uri": "s3://thaw/models/x", "shape": "cpu-local"}


@pytest.mark.parametrize(("spec", "current", "engine"), [
    # A CPU shape, enforce_eager left out: eager, the other engine settings kept.
    (CPU, None, {"enforce_eager": True}),
    ({**CPU, "engine": {"cpu_kvcache_gib": 0.5}}, None, {"cpu_kvcache_gib": 0.5, "enforce_eager": True}),
    # Said: kept, either way.
    ({**CPU, "engine": {"enforce_eager": False}}, None, {"enforce_eager": False}),
    ({**CPU, "engine": {"enforce_eager": True}}, None, {"enforce_eager": True}),
    # A GPU shape, an unknown shape (refused later, by the config's checks): unchanged.
    ({"uri": "s3://thaw/models/x", "shape": "gpu-1"}, None, None),
    ({"uri": "s3://thaw/models/x", "shape": "nope"}, None, None),
    # In force already (`thaw apply` of a file that leaves it out): its mode in force.
    (CPU, {**CPU, "engine": {"enforce_eager": True}}, {"enforce_eager": True}),
    (CPU, {**CPU, "engine": {"enforce_eager": False}}, {"enforce_eager": False}),
    (CPU, CPU, None),  # in force compiled by the default (seeded from the config file): stays so
])
def test_the_engine_mode_filled_in(spec: dict[str, Any], current: dict[str, Any] | None,
                                   engine: dict[str, Any] | None) -> None:
    assert eager_on_cpu(spec, with_gpu_shape(), current).get("engine") == engine


def test_an_adapter_takes_its_base_engine_so_nothing_is_filled_in() -> None:
    adapter = {"base": "demo", "adapter_uri": "s3://thaw/models/a"}
    assert eager_on_cpu(adapter, with_gpu_shape()) == adapter


def compiled_demo() -> ThawConfig:
    """The example config with its demo model's engine mode left out (compiled, the default)."""
    models = yaml.safe_load(EXAMPLE.read_text())["models"]
    del models[0]["engine"]["enforce_eager"]
    return registry_config(models=models)


def registry(db: Db) -> ModelRegistry:
    async def on_change(cfg: ThawConfig) -> None:
        pass

    return ModelRegistry(compiled_demo(), RegistryStore(db), FakeStoreReader(), EventLog(lambda: 1000.0),
                         on_change=on_change, clock=lambda: 1000.0)


async def test_a_deploy_on_a_cpu_shape_runs_eager_unless_it_says_compiled(state_db: StateDb) -> None:
    reg = registry(state_db())
    rec = await reg.deploy(ModelDeploy(name="mine", spec=ModelSpec.model_validate(CPU), note=None), "op")
    # Set in the revision (it shows in `thaw models show`) and in force.
    assert rec.revisions[-1].spec["engine"] == {"enforce_eager": True}
    assert reg.cfg.model("mine").engine.enforce_eager is True  # type: ignore[union-attr]
    compiled = await reg.deploy(ModelDeploy(name="fast", spec=ModelSpec.model_validate(
        {"uri": "s3://thaw/models/fast", "shape": "cpu-local", "engine": {"enforce_eager": False}}), note=None), "op")
    assert compiled.revisions[-1].spec["engine"] == {"enforce_eager": False}
    assert reg.cfg.model("fast").engine.enforce_eager is False  # type: ignore[union-attr]
    # The config file's model, seeded as written: compiled, the config's default.
    assert reg.cfg.model("demo").engine.enforce_eager is False  # type: ignore[union-attr]


def manager(db: Db) -> PoolManager:
    return build_pool(compiled_demo(), {}, HttpWorkerControl(None), store_reader=FakeStoreReader(), state_db=db)


async def test_apply_deploys_eager_on_a_cpu_shape_and_applying_again_changes_nothing(state_db: StateDb) -> None:
    m = manager(state_db())
    applier = m.parts.applier
    demo = m.cfg.model("demo")
    assert demo is not None and demo.engine.enforce_eager is False
    # The demo as the config declares it (compiled by default: in force so, it stays so), a new model.
    declared = current_spec(m.parts.model_admin.records["demo"])
    assert declared is not None and "enforce_eager" not in declared["engine"]
    file = [{"name": "demo", **declared}, {"name": "mine", **CPU}]
    request = ApplyRequest.model_validate({"models": file})
    done = await applier.apply(request, "ops")
    assert [(c.name, c.action) for c in done.changes] == [("mine", "deploy")]
    assert m.cfg.model("mine").engine.enforce_eager is True  # type: ignore[union-attr]
    assert m.cfg.model("demo").engine.enforce_eager is False  # type: ignore[union-attr]
    assert (await applier.apply(request, "ops")).changes == []
    # Said in the file: compiled, an update.
    said = ApplyRequest.model_validate({"models": [file[0], {**file[1], "engine": {"enforce_eager": False}}]})
    assert [(c.name, c.action) for c in (await applier.apply(said, "ops")).changes] == [("mine", "update")]
    assert m.cfg.model("mine").engine.enforce_eager is False  # type: ignore[union-attr]
