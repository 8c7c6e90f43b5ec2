"""The config in force changed one model (or the tenants) at a time gives what validating
it whole gives: the same config, or the same problems, line for line."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.warm_pool.in_process import EXAMPLE
from thaw.config import ConfigError, Tenant, ThawConfig, parse_config
from thaw.wire import ModelRecord, ModelRevision
from warm_pool.registry.in_force import compose, with_change, with_models, with_tenants
from warm_pool.registry.models import field_problems

NAMES = ("a", "b", "c", "p", "t")
TENANTS = ("demo", "acme", "beta")


def base_config() -> ThawConfig:
    """The example with GPU shapes of one and two GPUs, a pool that builds ``p``'s engine
    ahead, and a tenant that may call ``a`` and ``p``."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = "/tmp/unused"
    data["object_store"]["allowed_prefixes"] = ["s3://thaw/models/"]
    data["shapes"] += [
        {"name": f"gpu-{n}", "gpu_type": "h100-80gb", "gpu_count": n, "gpu_memory_gib": 80,
         "host_memory_gib": 200, "price_per_hour_usd": 4} for n in (1, 2)]
    data["pools"].append({"shape": "gpu-1", "prebuild": ["p"]})
    data["models"] = [{"name": "p", "uri": "s3://thaw/models/p", "shape": "gpu-1"},
                      {"name": "a", "uri": "s3://thaw/models/a", "shape": "cpu-local"}]
    data["tenants"].append({"name": "acme", "allowed_models": ["a", "p"]})
    return parse_config(data)


BASE = base_config()
# p on the shape its pool builds ahead; t an adapter of a.
START = [{"name": "p", "uri": "s3://thaw/models/p", "shape": "gpu-1"},
         {"name": "a", "uri": "s3://thaw/models/a", "shape": "cpu-local"},
         {"name": "t", "base": "a", "adapter_uri": "s3://thaw/models/t"}]


def spec_of(entries: list[dict[str, Any]]) -> Any:
    specs = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in entries}
    return specs.__getitem__


def full(base: ThawConfig, entries: list[dict[str, Any]]) -> ThawConfig | list[str]:
    try:
        return with_models(base, entries)
    except ConfigError as exc:
        return exc.problems


def changed(cfg: ThawConfig, base: ThawConfig, entries: list[dict[str, Any]], name: str,
            spec: dict[str, Any] | None) -> ThawConfig | list[str]:
    try:
        return with_change(cfg, base, spec_of(entries), name, spec)
    except ConfigError as exc:
        return exc.problems


def put(entries: list[dict[str, Any]], name: str, spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The entries with ``name`` first at ``spec`` (None: without it), as the registry orders them."""
    rest = [e for e in entries if e["name"] != name]
    return rest if spec is None else [{"name": name, **spec}, *rest]


# -- generated changes --------------------------------------------------------------------

def mostly(usual: tuple[Any, ...], rare: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """One of ``usual`` four times as often as one of ``rare`` (most changes are valid)."""
    return st.sampled_from((*usual * 4, *rare))


_BASE_EXTRAS: tuple[dict[str, Any], ...] = (
    {"engine": {"tensor_parallel_size": 4}}, {"engine": {"dtype": "bogus"}}, {"autoscaling": {"asleep_ttl_s": 60}},
    {"autoscaling": {"max_replicas": 0}}, {"tenant": "nobody"}, {"bogus_field": 1},
    {"adapter_uri": "s3://thaw/models/x"})
_ADAPTER_EXTRAS: tuple[dict[str, Any], ...] = (
    {"shape": "gpu-2"}, {"shape": "nope"}, {"max_context_tokens": 99}, {"lora": {"max_loras": 2}},
    {"uri": "s3://thaw/models/x"}, {"autoscaling": {"asleep_ttl_s": 60}},
    {"prewarm": [{"cron": "0 9 * * *", "for_s": 60}]})


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 3)) == 0:
        spec: dict[str, Any] = {"base": draw(mostly(("a", "b", "c"), ("p", "t", "zz"))),
                                "adapter_uri": draw(mostly(("s3://thaw/models/ad",), ("s3://thaw/else/ad", None))),
                                **draw(mostly(({}, {"tenant": "acme"}, {"autoscaling": {"max_replicas": 3}}),
                                              _ADAPTER_EXTRAS))}
    else:
        spec = {"uri": draw(mostly(("s3://thaw/models/m",), ("s3://thaw/else/m",))),
                "shape": draw(mostly(("cpu-local", "gpu-1", "gpu-2"), ("nope", None))),
                **draw(mostly(({}, {"engine": {"tensor_parallel_size": 1}}, {"engine": {"dtype": "bfloat16"}},
                               {"tenant": "acme"}, {"max_context_tokens": 1024}, {"lora": {"max_loras": 2}}),
                              _BASE_EXTRAS))}
    spec["served_name"] = draw(mostly((None, None, "s1"), ("s2", *NAMES)))
    return {k: v for k, v in spec.items() if v is not None}


tenant_lists = st.lists(st.builds(
    lambda name, allowed: Tenant(name=name, allowed_models=allowed),
    st.sampled_from(TENANTS), st.lists(st.sampled_from(("*", *NAMES, "zz")), max_size=3)), max_size=3)

changes = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NAMES), specs()),
    st.tuples(st.just("remove"), st.sampled_from(NAMES), st.none()),
    st.tuples(st.just("tenants"), st.none(), tenant_lists),
), max_size=12)


@settings(max_examples=300, deadline=None, database=None)
@given(changes)
def test_a_change_checked_alone_is_the_whole_configs_check(steps: list[tuple[str, Any, Any]]) -> None:
    base, entries = BASE, list(START)
    cfg = with_models(base, entries)
    for kind, name, arg in steps:
        if kind == "tenants":
            then = base.model_copy(update={"tenants": arg})
            want = full(then, entries)
            try:
                got: ThawConfig | list[str] = with_tenants(cfg, arg)
            except ConfigError as exc:
                got = exc.problems
            assert got == want
            if isinstance(got, ThawConfig):
                base, cfg = then, got
            continue
        after = put(entries, name, arg)
        want = full(base, after)
        got = changed(cfg, base, entries, name, arg)
        assert got == want
        if isinstance(got, ThawConfig):
            # The models the change did not touch are the ones in force, not validated again.
            untouched = [m for m in cfg.models if m.name != name and m.base != name]
            assert all(any(n is m for n in got.models) for m in untouched)
            entries, cfg = after, got


# -- the messages, case by case -----------------------------------------------------------

@pytest.mark.parametrize(("name", "spec", "says"), [
    # p moved off the shape its pool builds ahead: the pool's rule says so.
    ("p", {"uri": "s3://thaw/models/p", "shape": "gpu-2"},
     "pools[1] (gpu-1): prebuild names ['p'], which are not models of shape 'gpu-1'; models of that shape: []"),
    ("p", None, "pools[1] (gpu-1): prebuild names ['p']"),
    # Its base moved to two GPUs: the adapter's engine follows (tensor_parallel_size 2).
    ("a", {"uri": "s3://thaw/models/a", "shape": "gpu-2"}, None),
    # Its base made an adapter: the adapter's base is one (it is second now).
    ("a", {"base": "p", "adapter_uri": "s3://thaw/models/a"}, "models[2] (t): base 'a' is an adapter itself"),
    ("a", None, "models[1] (t): base 'a' is not a model of the config"),
    # A served name another model answers to: the rule names both, the new one first.
    ("new", {"uri": "s3://thaw/models/n", "shape": "cpu-local", "served_name": "t"},
     "models 'new' and 't' share the served name 't'"),
    ("new", {"uri": "s3://thaw/models/n", "shape": "gpu-1", "engine": {"tensor_parallel_size": 2}},
     "model 'new': engine.tensor_parallel_size 2 needs 2 GPUs"),
    ("new", {"uri": "s3://thaw/models/n", "shape": "gpu-1", "autoscaling": {"max_replicas": 0}, "x": 1},
     "model 'new': autoscaling.max_replicas: Input should be greater than 0; model 'new': x: unknown field"),
])
def test_a_change_names_what_it_breaks_as_the_whole_config_would(
        name: str, spec: dict[str, Any] | None, says: str | None) -> None:
    entries = START
    cfg = with_models(BASE, entries)
    got = changed(cfg, BASE, entries, name, spec)
    assert got == full(BASE, put(entries, name, spec))
    if says is None:
        assert isinstance(got, ThawConfig)
        t = got.model("t")
        assert t is not None and t.shape == "gpu-2" and t.engine.tensor_parallel_size == 2
    else:
        assert isinstance(got, list)
        assert says in field_problems(got, name), field_problems(got, name)


def test_a_tenant_removed_under_a_model_it_owns_is_refused_and_allowed_models_follow_the_models() -> None:
    entries = [START[0], {**START[1], "tenant": "acme"}, START[2]]
    cfg = with_models(BASE, entries)
    demo = BASE.tenants[0]
    with pytest.raises(ConfigError) as info:
        with_tenants(cfg, [demo])
    assert info.value.problems == ["(top level): models[1] (a): tenant 'acme' is not declared; declared: ['demo']"]
    with pytest.raises(ConfigError) as info:
        with_tenants(cfg, [demo, demo])
    assert info.value.problems == ["tenants: duplicate name 'demo'"]
    # Names of models not deployed are kept in the tenant's row, not in force.
    got = with_tenants(cfg, [demo, Tenant(name="acme", allowed_models=["a", "b"])])
    assert got.tenants[1].allowed_models == ["a"]
    # ... and come back with the model.
    back = with_change(got, BASE.model_copy(update={"tenants": [demo, Tenant(name="acme", allowed_models=["a", "b"])]}),
                       spec_of(entries), "b", {"uri": "s3://thaw/models/b", "shape": "cpu-local"})
    assert back.tenants[1].allowed_models == ["a", "b"]


# -- at start: the registry's models the config as written still admits ---------------------

def records(entries: list[dict[str, Any]]) -> list[ModelRecord]:
    return [ModelRecord(name=e["name"], revision=1, revisions=[ModelRevision(
        model=e["name"], revision=1, spec={k: v for k, v in e.items() if k != "name"}, created_at=0.0, who="op",
        change="deploy")]) for e in sorted(entries, key=lambda e: e["name"])]  # as the store lists them


def test_a_model_the_config_no_longer_admits_is_left_out_with_its_adapters_and_only_they() -> None:
    gone = [{"name": "b", "uri": "s3://thaw/models/b", "shape": "cpu-local"},
            {"name": "x", "uri": "s3://thaw/models/x", "shape": "gpu-9"},  # a shape the file no longer has
            {"name": "u", "base": "x", "adapter_uri": "s3://thaw/models/u"}]
    cfg, problems = compose(BASE, records([*START, *gone]))
    # a and b sort before p, which a pool builds ahead: both stay (bases before adapters).
    assert [m.name for m in cfg.models] == ["a", "b", "p", "t"]
    assert problems == [
        "x: (top level): models[3] (x): shape 'gpu-9' is not declared; declared: ['cpu-local', 'gpu-1', 'gpu-2']",
        "u: (top level): models[4] (u): base 'x' is not a model of the config"]
    assert compose(BASE, records(START)) == (with_models(BASE, sorted(START, key=lambda e: e["name"])), [])


def test_a_model_a_pool_builds_ahead_cannot_be_left_out() -> None:
    with pytest.raises(ConfigError) as info:
        compose(BASE, records([{"name": "p", "uri": "s3://thaw/models/p", "shape": "gpu-9"}]))
    assert info.value.problems == ["(top level): pools[1] (gpu-1): prebuild names ['p'], which are not models of "
                                   "shape 'gpu-1'; models of that shape: []"]
