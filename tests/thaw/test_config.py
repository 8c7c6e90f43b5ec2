from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from thaw.cli.main import main
from thaw.config import ConfigError, hash_api_key, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_config_is_valid() -> None:
    cfg = load_config(EXAMPLE)
    demo = cfg.model("thaw-demo")
    assert demo is not None and demo.name == "demo"
    assert cfg.model("demo") is demo  # by name or served name
    assert demo.autoscaling.min_replicas == 0
    assert cfg.object_store.resolved_endpoint_url == "http://127.0.0.1:8333"
    assert cfg.data_dir.is_absolute()
    # The example's key hash is the documented demo key.
    assert cfg.tenants[0].api_key_hashes == [hash_api_key("thaw-demo-key")]


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node: Any = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "expected_field", "expected_text"),
    [
        ("models.0.autoscaling.max_replicas", 0, "models[0].autoscaling.max_replicas", "greater than 0"),
        # min 2 > max 1
        ("models.0.autoscaling.min_replicas", 2, "models[0].autoscaling", "must not exceed max_replicas"),
        ("models.0.uri", "http://example.com/x", "models[0].uri", "is not an s3:// URI (http:// is refused)"),
        ("models.0.shape", "gpu-huge", "(top level)", "shape 'gpu-huge' is not declared"),
        ("models.0.autoscaling.idle_grace_s", -1, "models[0].autoscaling.idle_grace_s", "greater than or equal to 0"),
        ("models.0.engine.gpu_memory_utilization", 1.5, "models[0].engine.gpu_memory_utilization", "less than or equal to 1"),
        ("models.0.engine.load_format", "pickle", "models[0].engine.load_format", "'runai_streamer'"),
        ("models.0.idle_grace", 3, "models[0].idle_grace", "unknown field"),
        ("shapes.0.price_per_hour_usd", "cheap", "shapes[0].price_per_hour_usd", "valid number"),
        ("pools.0.standby_min", 5, "pools[0]", "standby_min (5) must not exceed standby_max (1)"),
        ("pools.0.prebuild", ["nope"], "(top level)", "prebuild names ['nope'], which are not models of shape"),
        ("pools.0.prebuild", ["demo", "demo"], "(top level)", "prebuild names a model twice"),
        ("tenants.0.api_key_hashes", ["plaintext-key"], "tenants[0].api_key_hashes[0]", "should match pattern"),
        ("tenants.0.allowed_models", ["nope"], "(top level)", "unknown models ['nope']"),
        ("object_store.kind", "gcs", "object_store.kind", "'embedded' or 's3'"),
        ("server.port", 70000, "server.port", "less than or equal to 65535"),
        ("limits.backend", "redis", "limits", "backend 'redis' needs 'url'"),
        ("limits.url", "http://cache:6379", "limits.url", "use redis://host:port/db"),
        ("limits.lease_ttl_s", 0.5, "limits.lease_ttl_s", "greater than or equal to 1"),
        ("state.backend", "postgres", "state", "backend postgres needs url"),
        ("state.url", "postgresql://db/thaw", "state", "url is for backend postgres"),
        ("state.backend", "mysql", "state.backend", "'sqlite' or 'postgres'"),
    ],
)
def test_bad_config_names_the_field(path: str, value: Any, expected_field: str, expected_text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_set(example(), path, value))
    problems = info.value.problems
    assert any(p.startswith(f"{expected_field}:") and expected_text in p for p in problems), problems


def test_limits_keys_are_namespaced_by_the_cluster() -> None:
    data = _set(example(), "limits", {"backend": "redis", "url": "redis://127.0.0.1:6379/0"})
    assert parse_config(_set(data, "cluster.name", "prod")).limits.key_prefix == "thaw:prod:limits"
    data = _set(data, "limits.key_prefix", "shared")
    assert parse_config(data).limits.key_prefix == "shared"
    assert load_config(EXAMPLE).limits.backend == "local"


def test_every_problem_is_reported_not_just_the_first() -> None:
    data = _set(example(), "server.port", 0)
    data = _set(data, "models.0.max_context_tokens", -5)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    fields = {p.split(":")[0] for p in info.value.problems}
    assert {"server.port", "models[0].max_context_tokens"} <= fields


def test_duplicate_model_names_rejected() -> None:
    data = example()
    data["models"].append(copy.deepcopy(data["models"][0]))
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert any("duplicate name 'demo'" in p for p in info.value.problems)


def test_env_references_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = EXAMPLE.read_text().replace("port: 8000", "port: ${THAW_TEST_PORT:-8001}")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path).server.port == 8001
    monkeypatch.setenv("THAW_TEST_PORT", "9123")
    assert load_config(path).server.port == 9123


def test_yaml_syntax_error_says_where(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("shapes:\n  - name: a\n   gpu_type: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "line " in info.value.problems[0] and "not valid YAML" in info.value.problems[0]


def test_config_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(EXAMPLE)]) == 0
    assert "ok" in capsys.readouterr().out

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_set(example(), "models.0.autoscaling.max_replicas", -1)))
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "models[0].autoscaling.max_replicas: Input should be greater than 0" in err

    assert main(["config", "check", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_prebuild_names_models_of_the_pools_shape() -> None:
    data = example()
    data["pools"][0]["prebuild"] = ["demo"]
    assert parse_config(data).pools[0].prebuild == ["demo"]


def test_a_pool_packs_or_prebuilds_not_both_yet() -> None:
    data = example()
    data["pools"][0].update({"pack": True})
    assert parse_config(data).pools[0].pack
    data["pools"][0]["prebuild"] = ["demo"]
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert any("pack and prebuild together are not supported yet" in p for p in info.value.problems)


def _with_adapter(**adapter: Any) -> dict[str, Any]:
    data = example()
    data["models"].append({"name": "a1", "base": "demo", "adapter_uri": "s3://thaw/adapters/a1", **adapter})
    return data


def test_an_adapter_takes_its_bases_shape_context_and_engine_and_the_base_gets_lora() -> None:
    cfg = parse_config(_with_adapter())
    a, demo = cfg.model("a1"), cfg.model("demo")
    assert a is not None and demo is not None and a.is_adapter
    assert (a.uri, a.shape, a.max_context_tokens, a.engine) == (
        "s3://thaw/adapters/a1", demo.shape, demo.max_context_tokens, demo.engine)
    assert cfg.engine_model(a) is demo and cfg.adapters_of("demo") == [a]
    assert cfg.engine_args(demo).extra == {**demo.engine.extra, "enable_lora": True, "max_loras": 4,
                                           "max_lora_rank": 16}
    assert cfg.engine_args(a) == demo.engine  # an adapter has no engine of its own


@pytest.mark.parametrize(("change", "text"), [
    ({"base": "nope"}, "base 'nope' is not a model of the config"),
    ({"adapter_uri": None}, "an adapter needs adapter_uri"),
    ({"uri": "s3://thaw/elsewhere"}, "an adapter needs adapter_uri (its files), and no uri of its own"),
    ({"max_context_tokens": 99}, "an adapter's max_context_tokens is its base's"),
    ({"lora": {"max_loras": 2}}, "an adapter has no lora settings"),
    ({"adapter_uri": "s3://other-bucket/a1"}, "uri"),
])
def test_a_bad_adapter_names_the_problem(change: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_with_adapter(**change))
    assert any(text in p for p in info.value.problems), info.value.problems


def test_an_adapter_of_an_adapter_is_refused() -> None:
    data = _with_adapter()
    data["models"].append({"name": "a2", "base": "a1", "adapter_uri": "s3://thaw/adapters/a2"})
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert any("base 'a1' is an adapter itself" in p for p in info.value.problems)


def test_a_model_is_found_by_name_or_served_name_and_a_non_name_finds_none() -> None:
    cfg = parse_config({
        "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8, "price_per_hour_usd": 0}],
        "models": [{"name": "a", "uri": "s3://thaw/a", "shape": "cpu", "served_name": "alpha"},
                   {"name": "b", "uri": "s3://thaw/b", "shape": "cpu"},
                   {"name": "a-lora", "base": "a", "adapter_uri": "s3://thaw/a-lora"}]})
    assert cfg.model("a") is cfg.model("alpha") is cfg.models[0] and cfg.model("b") is cfg.models[1]
    assert cfg.model("nope") is None and [m.name for m in cfg.adapters_of("a")] == ["a-lora"]
    # A request's "model" that is not a string (the fuzzer sends {}) finds no model.
    assert cfg.model({}) is None and cfg.model(None) is None  # type: ignore[arg-type]
