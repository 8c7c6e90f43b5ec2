"""`thaw bench cold-start`: the report's arithmetic on recorded samples, the tier checks,
and one real smoke run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from loadtests import bench_cold_start as bench
from thaw.embedded_store import EmbeddedStore

# Recorded on the 2-core CPU machine (shortened).
BASELINE_SAMPLES = [
    {"ttft_s": 40.0, "phases_s": {"server_ready": 39.9, "first_token": 0.1}},
    {"ttft_s": 44.0, "phases_s": {"server_ready": 43.8, "first_token": 0.2}},
    {"ttft_s": 50.0, "phases_s": {"server_ready": 49.9, "first_token": 0.1}},
]
EAGER_SAMPLES = [
    {"ttft_s": 2.0, "tier": "s3", "load_s": 0.30, "phases_s": {"weights_loaded": 0.8, "engine_ready": 0.7}},
    {"ttft_s": 3.0, "tier": "s3", "load_s": 0.50, "phases_s": {"weights_loaded": 1.0, "engine_ready": 0.9}},
    {"ttft_s": 2.2, "tier": "s3", "load_s": 0.40, "phases_s": {"weights_loaded": 0.9, "engine_ready": 0.8}},
]


@pytest.mark.parametrize(
    ("samples", "median", "failed"),
    [
        (BASELINE_SAMPLES, 44.0, 0),  # 40, 44, 50 -> 44
        (EAGER_SAMPLES, 2.2, 0),  # 2.0, 2.2, 3.0 -> 2.2
        ([{"ttft_s": 1.0}, {"ttft_s": 3.0}], 2.0, 0),  # even count: (1 + 3) / 2
        ([{"ttft_s": 5.0}, {"ttft_s": None, "error": "x"}], 5.0, 1),  # a failed rep is not a sample
        ([{"ttft_s": None, "error": "x"}], None, 1),
    ],
)
def test_summary_median_of_successful_reps(samples: list[dict], median: float | None, failed: int) -> None:
    s = bench.summarize_variant(samples)
    assert s["median_ttft_s"] == median
    assert (s["reps"], s["failed"], s["n"]) == (len(samples), failed, len(samples) - failed)


def test_phase_and_load_medians() -> None:
    s = bench.summarize_variant(EAGER_SAMPLES)
    # weights_loaded: 0.8, 0.9, 1.0 -> 0.9; engine_ready: 0.7, 0.8, 0.9 -> 0.8
    assert s["phase_medians_s"] == {"weights_loaded": 0.9, "engine_ready": 0.8}
    assert s["median_load_s"] == 0.4  # 0.3, 0.4, 0.5
    # runai_streamer's baseline reports no load time: none, rather than 0.
    assert bench.summarize_variant(BASELINE_SAMPLES)["median_load_s"] is None


MEDIANS = {
    bench.BASELINE_EAGER: 20.0, bench.BASELINE_EAGER_THAW: 16.0,
    bench.BASELINE_COMPILED: 44.0, bench.BASELINE_COMPILED_THAW: 40.0,
    bench.EAGER: 2.0, bench.HOST: 1.0, bench.DISK: 1.5, bench.LAUNCH: 30.0,
    bench.SNAPSHOT: 5.5, bench.NO_SNAPSHOT: None,
    bench.SWAP_HOST: 0.4, bench.SWAP_S3: 0.8, bench.SWAP_HOST_COMPILED: 0.44, bench.SWAP_S3_COMPILED: 0.88,
}


def test_ratios_compare_like_with_like() -> None:
    assert bench.compute_ratios(MEDIANS) == {
        # eager Thaw over eager vLLM
        "standby_eager_vs_baseline_eager": 0.1,  # 2 / 20
        "host_eager_vs_baseline_eager": 0.05,  # 1 / 20
        "disk_eager_vs_baseline_eager": 0.075,  # 1.5 / 20
        "launch_eager_vs_baseline_eager": 1.5,  # 30 / 20
        # compiled Thaw over compiled vLLM
        "standby_snapshot_vs_baseline_compiled": 0.125,  # 5.5 / 44
        "standby_no_snapshot_vs_baseline_compiled": None,  # not run
        # a swap into a built engine, over vLLM started on demand in the same mode
        "swap_host_eager_vs_baseline_eager": 0.02,  # 0.4 / 20
        "swap_s3_eager_vs_baseline_eager": 0.04,  # 0.8 / 20
        "swap_host_compiled_vs_baseline_compiled": 0.01,  # 0.44 / 44
        "swap_s3_compiled_vs_baseline_compiled": 0.02,  # 0.88 / 44
        # packed beside a serving model, an adapter into a serving base: not run here
        "packed_eager_vs_baseline_eager": None, "adapter_vs_baseline_eager": None,
        "packed_eager_vs_standby_eager": None,
        # the split: Thaw's loader alone, then the standby with that loader
        "loader_share_eager": 0.8,  # 16 / 20
        "standby_share_eager": 0.125,  # 2 / 16
        "loader_share_compiled": 0.9091,  # 40 / 44
        "standby_share_compiled": 0.1375,  # 5.5 / 40
    }


def test_the_split_multiplies_back_to_the_standby_ratio() -> None:
    r = {k: v for k, v in bench.compute_ratios(MEDIANS).items() if v is not None}
    # 0.8 x 0.125 = 0.1
    assert r["loader_share_eager"] * r["standby_share_eager"] == pytest.approx(r["standby_eager_vs_baseline_eager"])
    # 0.9091 x 0.1375 = 0.125 (to the rounding)
    assert r["loader_share_compiled"] * r["standby_share_compiled"] == pytest.approx(
        r["standby_snapshot_vs_baseline_compiled"], abs=1e-4)


def test_no_ratio_without_its_denominator() -> None:
    # Only Thaw ran: nothing to compare with.
    assert set(bench.compute_ratios({bench.EAGER: 2.2, bench.SNAPSHOT: 5.0}).values()) == {None}


def test_every_ratio_is_eager_over_eager_or_compiled_over_compiled() -> None:
    for key, (num, den) in bench.RATIOS.items():
        assert (num in bench.EAGER_VARIANTS) == (den in bench.EAGER_VARIANTS), key


def test_tier_table_rows_from_the_summaries() -> None:
    summaries = {bench.EAGER: bench.summarize_variant(EAGER_SAMPLES),
                 bench.BASELINE_EAGER: bench.summarize_variant(BASELINE_SAMPLES)}
    rows = {r["tier"]: r for r in bench.tier_table(summaries)}
    assert list(rows) == ["hot", "swap_host", "swap_s3", "host", "disk", "s3", "launch", "adapter", "packed",
                          "on_demand_vllm", "on_demand_vllm_thaw_loader"]
    assert rows["s3"] == {"tier": "s3", "variant": bench.EAGER, "median_ttft_s": 2.2, "median_load_s": 0.4, "n": 3}
    assert rows["on_demand_vllm"] == {"tier": "on_demand_vllm", "variant": bench.BASELINE_EAGER,
                                      "median_ttft_s": 44.0, "median_load_s": None, "n": 3}
    # Not run: a row all the same, with nothing in it.
    assert rows["host"] == {"tier": "host", "variant": bench.HOST, "median_ttft_s": None, "median_load_s": None,
                            "n": 0}


@pytest.mark.parametrize(("variant", "tier"), sorted(bench.EXPECTED_TIER.items()))
def test_the_intended_tier_passes(variant: str, tier: str) -> None:
    bench.check_tier(variant, tier, bench.EXPECTED_WEIGHTS.get(variant))


@pytest.mark.parametrize(("variant", "weights_from"), [
    (bench.SWAP_HOST, "s3"), (bench.SWAP_S3, "host"), (bench.SWAP_HOST_COMPILED, None)])
def test_a_swap_whose_weights_came_from_elsewhere_is_not_counted(variant: str, weights_from: str | None) -> None:
    with pytest.raises(bench.WrongTier, match="measures a swap with weights from"):
        bench.check_tier(variant, "swap", weights_from)


@pytest.mark.parametrize(
    ("variant", "tier"),
    [
        (bench.HOST, "disk"),  # the host copy was gone
        (bench.HOST, "s3"),
        (bench.DISK, "host"),  # the host copy was not dropped
        (bench.EAGER, "disk"),  # a cache was left full
        (bench.SNAPSHOT, "host"),
        (bench.LAUNCH, "s3"),  # a standby was there after all
        (bench.HOT, "s3"),  # the replica had gone: a cold start
        (bench.EAGER, None),  # no cold-start record for the request
    ],
)
def test_another_tier_fails_the_rep_naming_both(variant: str, tier: str | None) -> None:
    with pytest.raises(bench.WrongTier) as e:
        bench.check_tier(variant, tier)
    assert variant in str(e.value) and repr(bench.EXPECTED_TIER[variant]) in str(e.value)
    assert repr(tier) in str(e.value)


def test_every_thaw_variant_has_a_tier_and_every_baseline_a_spec() -> None:
    assert set(bench.VARIANTS) == set(bench.THAW_VARIANTS) | set(bench.BASELINES)
    assert set(bench.VARIANT_DESCRIPTIONS) == set(bench.VARIANTS)
    # The loaded tiers' cache states are known.
    assert {t for t in bench.EXPECTED_TIER.values()
            if t not in ("hot", "launch", "swap", "packed", "adapter")} == set(bench.TIER_HOLDINGS)
    # A swap's weights come from a tier whose cache state is known too.
    assert set(bench.EXPECTED_WEIGHTS) == set(bench.SWAP_VARIANTS)
    assert set(bench.EXPECTED_WEIGHTS.values()) <= set(bench.TIER_HOLDINGS)


URI = "s3://thaw/bench/demo-tiny"


@pytest.mark.parametrize(
    ("cached", "have"),
    [
        ([], {"host": False, "disk": False}),
        ([{"uri": URI, "tier": "host", "bytes": 10, "total_bytes": 10},
          {"uri": URI, "tier": "disk", "bytes": 10, "total_bytes": 10}], {"host": True, "disk": True}),
        # a part of it is not the model
        ([{"uri": URI, "tier": "disk", "bytes": 4, "total_bytes": 10}], {"host": False, "disk": False}),
        # another model's weights
        ([{"uri": "s3://thaw/other", "tier": "host", "bytes": 10, "total_bytes": 10}],
         {"host": False, "disk": False}),
    ],
)
def test_holdings_of_a_worker(cached: list[dict], have: dict[str, bool]) -> None:
    assert bench.holdings(cached, URI) == have


@pytest.mark.parametrize(
    ("have", "tier", "ok"),
    [
        ({"host": True, "disk": True}, "host", True),  # the disk does not matter: host is read first
        ({"host": False, "disk": True}, "host", False),
        ({"host": True, "disk": True}, "disk", False),  # the host copy would be read
        ({"host": False, "disk": True}, "disk", True),
        ({"host": False, "disk": False}, "s3", True),
        ({"host": False, "disk": True}, "s3", False),
    ],
)
def test_cache_state_each_tier_needs(have: dict[str, bool], tier: str, ok: bool) -> None:
    assert bench.holding_ok(have, bench.TIER_HOLDINGS[tier]) is ok


def test_thaw_loader_time_from_the_engine_log() -> None:
    log = ("INFO 11-30 10:00:00 [vllm_loader.py:290] Thaw streamer: 1 files, 10.5 MiB in 0.12 s "
           "(0.09 GB/s) from s3://thaw/bench/demo-tiny; load_weights 0.01 s\n")
    assert bench.thaw_load_seconds("starting\n" + log) == 0.12
    # runai_streamer's log has no such line: the thaw baseline would not have run Thaw's loader.
    assert bench.thaw_load_seconds("Loading weights with runai_streamer\n") is None


def test_baseline_commands() -> None:
    runai = bench.baseline_cmd("py", URI, 8000, bench.BASELINES[bench.BASELINE_EAGER])
    assert runai[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in runai and runai[runai.index("--load-format") + 1] == "runai_streamer"
    thaw = bench.baseline_cmd("py", URI, 8000, bench.BASELINES[bench.BASELINE_COMPILED_THAW])
    assert thaw[:3] == ["py", "-m", "loadtests.vllm_thaw_server"]
    assert "--enforce-eager" not in thaw and thaw[thaw.index("--load-format") + 1] == "thaw"


def test_report_shape_and_goals() -> None:
    report = bench.build_report({bench.BASELINE_EAGER: BASELINE_SAMPLES, bench.EAGER: EAGER_SAMPLES},
                                environment={"cpu_count": 2}, settings={"reps": 3})
    assert set(report) >= {"environment", "settings", "variants", "tier_table", "ratios", "ratio_definitions",
                           "goals", "goals_not_met", "goals_not_measured"}
    eager = report["variants"][bench.EAGER]
    assert eager["samples"] == EAGER_SAMPLES and eager["median_ttft_s"] == 2.2 and eager["description"]
    assert report["ratios"]["standby_eager_vs_baseline_eager"] == 0.05  # 2.2 / 44
    assert report["goals"]["standby_eager_vs_baseline_eager"] == {"at_most": 0.08, "measured": 0.05, "met": True}
    assert report["goals"]["standby_snapshot_vs_baseline_compiled"]["met"] is None
    assert report["goals_not_met"] == []
    assert report["goals_not_measured"] == ["standby_snapshot_vs_baseline_compiled",
                                            "swap_host_eager_vs_baseline_eager",
                                            "swap_host_compiled_vs_baseline_compiled",
                                            "packed_eager_vs_standby_eager", "adapter_ttft_s"]
    assert report["ratio_definitions"]["standby_share_eager"] == {
        "numerator": bench.EAGER, "denominator": bench.BASELINE_EAGER_THAW}
    json.dumps(report)  # serialisable as is


def test_a_goal_missed_is_listed() -> None:
    slow = [{"ttft_s": 4.4}]  # 4.4 / 44 = 0.1 > 0.08
    report = bench.build_report({bench.BASELINE_EAGER: BASELINE_SAMPLES, bench.EAGER: slow},
                                environment={}, settings={})
    assert report["goals"]["standby_eager_vs_baseline_eager"]["met"] is False
    assert report["goals_not_met"] == ["standby_eager_vs_baseline_eager"]


def test_summary_says_which_goals_are_not_met(capsys: pytest.CaptureFixture[str]) -> None:
    report = bench.build_report({bench.BASELINE_EAGER: BASELINE_SAMPLES, bench.EAGER: [{"ttft_s": 4.4}],
                                 bench.HOST: [{"ttft_s": None, "error": "WrongTier: host_eager ..."}]},
                                environment={}, settings={})
    bench._print_summary(report)
    out = capsys.readouterr().out
    assert "GOALS NOT MET: standby_eager_vs_baseline_eager" in out
    assert "failed: WrongTier: host_eager" in out


def test_cli_arguments_and_defaults() -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    a = p.parse_args(["--out", "x.json"])
    assert (a.reps, a.variants, a.size, a.cache_verify_sha256) == (3, list(bench.VARIANTS), "tiny", True)
    a = p.parse_args(["--out", "x.json", "--reps", "1", "--variants", "standby_eager", "baseline_eager", "hot",
                      "--no-cache-verify-sha256"])
    assert a.variants == ["standby_eager", "baseline_eager", "hot"] and a.cache_verify_sha256 is False
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x.json", "--variants", "baseline"])  # the old, unlike name


def test_an_adapter_goal_is_on_its_own_ttft() -> None:
    report = bench.build_report({bench.ADAPTER: [{"ttft_s": 0.3}, {"ttft_s": 0.7}, {"ttft_s": 0.4}]},
                                environment={}, settings={})
    assert report["goals"]["adapter_ttft_s"] == {"at_most": 0.5, "measured": 0.4, "met": True}


def test_stack_config_with_the_packed_and_adapter_variants(tmp_path: Path) -> None:
    from thaw.config import parse_config

    store = bench.Store("http://127.0.0.1:9", "a", "b", tmp_path / "creds.json", "thaw")
    caches = bench.CacheSettings.for_model(11 << 20, tmp_path / "cache", verify_sha256=True)
    models = bench.ThawModels(packed="cs-packed", adapter="cs-lora")
    cfg = parse_config(bench.stack_config(store, URI, tmp_path / "data", 8000, models, caches, 2.0, 300.0,
                                          base_uri=URI + "-seed1", adapter_uri=URI + "-lora"))
    pools = {p.shape: p for p in cfg.pools}
    assert pools[bench.PACK_SHAPE].pack and not pools[bench.LORA_SHAPE].pack
    by = {m.name: m for m in cfg.models}
    assert by[models.pack_host].autoscaling.min_replicas == 1 and by["cs-packed"].shape == bench.PACK_SHAPE
    assert by["cs-lora"].base == models.adapter_base and by["cs-lora"].shape == bench.LORA_SHAPE
    assert cfg.engine_args(by[models.adapter_base]).extra["enable_lora"] is True


def test_stack_config_parses_with_both_shapes_and_caches(tmp_path: Path) -> None:
    from thaw.config import parse_config

    store = bench.Store("http://127.0.0.1:9", "a", "b", tmp_path / "creds.json", "thaw")
    caches = bench.CacheSettings.for_model(11 << 20, tmp_path / "cache", verify_sha256=True)
    assert (caches.disk_gib, caches.host_gib) == (1.0, 1.0)  # 2 x 11 MiB, at least 1 GiB
    models = bench.ThawModels(no_snapshot=["cs-nosnap-0"])
    cfg = parse_config(bench.stack_config(store, URI, tmp_path / "data", 8000, models, caches, 2.0, 300.0))
    main, launch = cfg.shape(bench.SHAPE), cfg.shape(bench.LAUNCH_SHAPE)
    assert main is not None and main.cache is not None and main.host_cache_gib == 1.0
    assert launch is not None and launch.cache is None and launch.host_cache_gib == 0
    pools = {p.shape: p for p in cfg.pools}
    assert (pools[bench.LAUNCH_SHAPE].standby_min, pools[bench.LAUNCH_SHAPE].standby_max) == (0, 0)
    assert {m.name: m.shape for m in cfg.models}[models.launch] == bench.LAUNCH_SHAPE
    assert all(m.engine.load_format == "thaw" for m in cfg.models)


@pytest.mark.integration
@pytest.mark.engine
def test_smoke_one_eager_rep_per_tier(store: EmbeddedStore, tmp_path: Path) -> None:
    """The real thing, small: one rep of the eager baseline and of Thaw's eager tiers on
    the tiny model (a few minutes here). Times are printed, not asserted."""
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "cold.json"
    args = p.parse_args([
        "--out", str(out), "--reps", "1", "--variants", "baseline_eager", "standby_eager", "host_eager", "hot",
        "--work-dir", str(tmp_path / "work"), "--bucket", store.bucket, "--timeout-s", "300",
        "--s3-endpoint-url", str(store.endpoint().endpoint_url), "--s3-credentials-file",
        str(store.root / "credentials.json"),
    ])
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    assert all(v["failed"] == 0 for v in report["variants"].values())
    (b,) = report["variants"]["baseline_eager"]["samples"]
    (e,) = report["variants"]["standby_eager"]["samples"]
    (h,) = report["variants"]["host_eager"]["samples"]
    (hot,) = report["variants"]["hot"]["samples"]
    assert (e["tier"], h["tier"], hot["tier"]) == ("s3", "host", "hot")
    assert e["cold_header"] == "true" and e["request_id"].startswith("bench-") and e["header_tier"] == "s3"
    # The activator's phases of this very request, and they add up to its TTFT.
    assert set(e["phases_s"]) == {"queued", "instance_acquired", "snapshot_restored", "weights_loaded",
                                  "engine_ready", "first_token"}
    assert abs(sum(e["phases_s"].values()) - e["activator_total_s"]) < 0.05
    assert e["load_s"] > 0 and h["load_s"] > 0
    assert report["ratios"]["standby_eager_vs_baseline_eager"] == round(e["ttft_s"] / b["ttft_s"], 4)
    assert report["environment"]["model"]["size"] == "tiny"
    print(f"\nbaseline eager {b['ttft_s']:.2f}s, standby eager {e['ttft_s']:.2f}s, host {h['ttft_s']:.2f}s, "
          f"hot {hot['ttft_s']:.3f}s")
