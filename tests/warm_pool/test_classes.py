"""Each model's engine class and size with thousands of models: reads spread over
turns, the longest due first, and only what changed recomputed."""

from __future__ import annotations

from typing import Any

from tests.simulator.support import config
from thaw.config import ThawConfig
from warm_pool.classes import READS_PER_REFRESH, ModelClasses, engine_bytes

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 4096}


class Store:
    def __init__(self) -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        self.reads: list[str] = []

    def read(self, uri: str) -> dict[str, Any] | None:
        self.reads.append(uri)
        return self.configs.get(uri, LLAMA)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_reads_spread_over_turns_and_each_uri_is_read_once_per_refresh_interval() -> None:
    cfg = config(200)
    store, clock = Store(), Clock()
    classes = ModelClasses(store.read, clock=clock, refresh_s=60)
    turns = 0
    while classes.due(cfg, clock()):
        await classes.refresh(cfg)
        turns += 1
        assert len(store.reads) <= turns * READS_PER_REFRESH
    assert turns == -(-200 // READS_PER_REFRESH)
    assert sorted(store.reads) == sorted(m.uri for m in cfg.models)
    assert set(classes.classes) == {m.name for m in cfg.models}
    # Nothing is due again until refresh_s has passed, and then every URI once more.
    clock.t += 59
    assert not classes.due(cfg, clock())
    clock.t += 1
    while classes.due(cfg, clock()):
        await classes.refresh(cfg)
    assert len(store.reads) == 400 and len(set(store.reads)) == 200


async def test_only_what_changed_is_recomputed_and_an_unchanged_table_keeps_its_identity() -> None:
    cfg = config(20)
    store, clock = Store(), Clock()
    classes = ModelClasses(store.read, clock=clock, refresh_s=60)
    await classes.refresh(cfg)
    before = classes.classes
    clock.t += 60
    await classes.refresh(cfg)
    assert classes.classes is before  # read again, nothing moved: the same table
    # One model's config.json changes in the store: its class, and only its, moves.
    store.configs["s3://thaw/m3"] = {**LLAMA, "num_hidden_layers": 8}
    clock.t += 60
    await classes.refresh(cfg)
    moved = {n for n in before if classes.classes[n] != before[n]}
    assert moved == {"m3"} and classes.classes is not before
    # A model removed from the config loses its class; one added gets one at once.
    data = cfg.model_dump()
    data["models"] = [*data["models"][1:], {**data["models"][0], "name": "new", "uri": "s3://thaw/new"}]
    smaller = ThawConfig.model_validate(data)
    assert classes.due(smaller, clock())
    await classes.refresh(smaller)
    assert "m0" not in classes.classes and "new" in classes.classes


async def test_engine_bytes_follow_the_sizes_table() -> None:
    data = config(3).model_dump()
    data["pools"][0]["pack"] = True
    for m in data["models"]:
        m["engine"]["gpu_memory_utilization"] = 0.3
    cfg = ThawConfig.model_validate(data)
    store, clock = Store(), Clock()
    sizes = {"s3://thaw/m0": 1 << 30, "s3://thaw/m1": 2 << 30}
    classes = ModelClasses(store.read, clock=clock, refresh_s=60, read_size=sizes.get)
    await classes.refresh(cfg)
    first = engine_bytes(cfg, classes)
    assert set(first) == {"m0", "m1"} and engine_bytes(cfg, classes) is first
    sizes["s3://thaw/m2"] = 1 << 30
    clock.t += 60
    await classes.refresh(cfg)
    assert set(engine_bytes(cfg, classes)) == {"m0", "m1", "m2"}
