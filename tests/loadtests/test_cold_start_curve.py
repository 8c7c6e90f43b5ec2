"""The size curve's arithmetic: lines, residuals, bandwidth over the copy reference."""

from __future__ import annotations

import pytest

from loadtests import bench_cold_start as bench
from loadtests.cold_start_curve import GB, curve, extrapolate, fit_line


def test_a_line_through_exact_points_has_no_residual() -> None:
    # 0.5 s fixed + 2 s/GB: at 1, 2 and 4 GB that is 2.5, 4.5 and 8.5 s.
    line = fit_line([(1.0, 2.5), (2.0, 4.5), (4.0, 8.5)])
    assert line is not None
    assert line.fixed_s == pytest.approx(0.5) and line.s_per_gb == pytest.approx(2.0)
    assert line.gbps == pytest.approx(0.5) and line.max_residual == pytest.approx(0.0)
    assert line.at(16.0) == pytest.approx(32.5)


def test_residuals_are_relative_to_the_measured_point() -> None:
    # Points (0, 1), (1, 3), (2, 3): mean x 1, mean y 7/3, slope (-1*-4/3 + 1*2/3) / 2 = 1,
    # fixed 7/3 - 1 = 4/3. At x=1 the fit is 7/3 against 3: residual (7/3 - 3) / 3 = -2/9.
    line = fit_line([(0.0, 1.0), (1.0, 3.0), (2.0, 3.0)])
    assert line is not None
    assert line.fixed_s == pytest.approx(4 / 3) and line.s_per_gb == pytest.approx(1.0)
    assert [r for _, _, r in line.points] == pytest.approx([1 / 3, -2 / 9, 1 / 9])
    assert line.max_residual == pytest.approx(1 / 3)


def test_no_line_from_one_size_and_no_bandwidth_without_a_slope() -> None:
    assert fit_line([(1.0, 2.0)]) is None
    assert fit_line([(1.0, 2.0), (1.0, 3.0)]) is None  # one size twice is still one size
    flat = fit_line([(1.0, 2.0), (2.0, 2.0)])
    assert flat is not None and flat.gbps is None


def test_extrapolation_prolongs_the_line() -> None:
    line = fit_line([(1.0, 1.5), (2.0, 2.5)])  # 0.5 s + 1 s/GB
    assert line is not None
    assert extrapolate(line, {"8B": 16e9}) == {"8B": 16.5}


def _size(nbytes: int, ttft: dict[str, float], weights: dict[str, float], mapped: float = 8.0,
          store: float | None = None) -> dict:
    ref = {"mapped_gbps": mapped, "fresh_gbps": mapped / 4} | ({"store_gbps": store} if store else {})
    return {"size_bytes": nbytes, "reference": ref,
            "variants": {v: {"median_ttft_s": t, "median_weights_s": weights.get(v)} for v, t in ttft.items()}}


def test_the_curve_per_tier_against_the_reference() -> None:
    # swap_host: 0.3 s + 0.25 s/GB (4 GB/s: half the 8 GB/s copy, twice the 2 GB/s fresh one);
    # its weights: 0.25 s/GB, no fixed part. The baseline: 30 s + 10 s/GB.
    sizes = [_size(int(gb * GB), {bench.SWAP_HOST: 0.3 + 0.25 * gb, bench.BASELINE_EAGER: 30 + 10 * gb},
                   {bench.SWAP_HOST: 0.25 * gb}) for gb in (0.25, 1.0, 4.0)]
    c = curve(sizes, bench.TIER_TABLE)
    assert c["reference"]["mapped"]["gbps"] == pytest.approx(8.0)
    assert c["reference"]["fresh"]["gbps"] == pytest.approx(2.0)
    swap = c["tiers"]["swap_host"]
    assert swap["ttft"]["line"]["fixed_s"] == pytest.approx(0.3)
    assert swap["ttft"]["gbps_over_mapped_copy"] == pytest.approx(0.5)
    assert swap["weights"]["gbps_over_fresh_copy"] == pytest.approx(2.0)
    assert swap["ttft"]["extrapolated"]["8B"] == pytest.approx(0.3 + 0.25 * 16.06, abs=0.01)
    assert c["tiers"]["on_demand_vllm"]["ttft"]["line"]["s_per_gb"] == pytest.approx(10.0)
    assert "weights" not in c["tiers"]["on_demand_vllm"]  # no weights time for it
    assert "host" not in c["tiers"]  # not measured: no row
    # No store ceiling was measured: nothing is put over it.
    assert c["reference"]["store"]["gbps"] is None and "gbps_over_store_ceiling" not in swap["weights"]


def test_the_store_tiers_against_the_stores_ceiling() -> None:
    # The store gives 1 GB/s to plain GETs; the swap from it moves its weights at 0.8 GB/s
    # (0.8 of it), the standby's loader at 0.9 GB/s; the swap from host memory never reads it.
    per_size = {}
    for label, gb in (("256MiB", 0.268), ("1GiB", 1.074)):
        weights = {bench.SWAP_S3: gb / 0.8, bench.EAGER: gb / 0.9, bench.SWAP_HOST: gb / 4}
        r = _size(int(gb * GB), {v: 1.0 + w for v, w in weights.items()}, weights, store=1.0)
        r["ratios"] = bench.compute_ratios({v: x["median_ttft_s"] for v, x in r["variants"].items()})
        r["weights_gbps"] = bench.weights_bandwidth(r["variants"], r["size_bytes"], r["reference"])
        per_size[label] = r
    assert per_size["1GiB"]["weights_gbps"][bench.SWAP_S3]["over_store_ceiling"] == pytest.approx(0.8)
    assert "over_store_ceiling" not in per_size["1GiB"]["weights_gbps"][bench.SWAP_HOST]
    report = bench.build_curve_report(per_size, environment={}, settings={})
    assert report["curve"]["reference"]["store"]["gbps"] == pytest.approx(1.0)
    assert report["curve"]["tiers"]["swap_s3"]["weights"]["gbps_over_store_ceiling"] == pytest.approx(0.8)
    g = report["goals"]
    assert g["swap_s3_eager_weights_over_store_ceiling_every_size"] == {
        "at_least": 0.85, "measured": pytest.approx(0.8), "met": False}
    assert g["standby_eager_weights_over_store_ceiling_every_size"]["met"] is True
    assert "swap_s3_eager_weights_over_store_ceiling_every_size" in report["goals_not_met"]


@pytest.mark.integration
def test_the_stores_ceiling_reads_every_byte_of_the_model(s3, s3_prefix: str) -> None:
    import os

    from loadtests.cold_start_curve import store_ceiling
    from weight_streaming.manifest import parse_s3_uri

    bucket, prefix = parse_s3_uri(s3_prefix)
    client = s3.client()
    for name, n in (("a.safetensors", 3 * (1 << 20) + 7), ("b.safetensors", 1000)):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=os.urandom(n))
    client.put_object(Bucket=bucket, Key=f"{prefix}/config.json", Body=b"{}")  # not weights: not read
    got = store_ceiling(s3, s3_prefix, chunks_mib=[1, 2], concurrency=[1, 2], reps=1)
    assert got["bytes"] == 3 * (1 << 20) + 7 + 1000
    assert len(got["store_grid"]) == 4 and all(r["gbps"] > 0 for r in got["store_grid"])
    assert got["store_gbps"] == max(r["gbps"] for r in got["store_grid"])
    assert got["store_best"] in [{"chunk_mib": r["chunk_mib"], "concurrency": r["concurrency"]}
                                 for r in got["store_grid"]]


def test_curve_goals_read_each_size_and_the_lines() -> None:
    per_size = {}
    for label, gb in (("256MiB", 0.268), ("1GiB", 1.074), ("4GiB", 4.295)):
        # The swap moves its weights at 3 GB/s against an 8 GB/s copy (0.375: under the 0.5 goal).
        r = _size(int(gb * GB), {bench.SWAP_HOST: 0.2 + gb / 3, bench.BASELINE_EAGER: 40.0 + gb},
                  {bench.SWAP_HOST: gb / 3})
        r["ratios"] = bench.compute_ratios({v: x["median_ttft_s"] for v, x in r["variants"].items()})
        r["weights_gbps"] = bench.weights_bandwidth(r["variants"], r["size_bytes"], r["reference"])
        per_size[label] = r
    report = bench.build_curve_report(per_size, environment={}, settings={})
    g = report["goals"]
    assert g["swap_host_weights_over_mapped_copy_from_1GiB"]["measured"] == pytest.approx(0.375, abs=1e-3)
    assert g["swap_host_weights_over_mapped_copy_from_1GiB"]["met"] is False
    assert g["swap_host_ttft_fixed_s"] == {"at_most": 0.25, "measured": pytest.approx(0.2), "met": True}
    # The largest ratio: at 4 GiB, (0.2 + 4.295/3) / 44.295 = 0.0368.
    assert g["swap_host_eager_vs_baseline_eager_every_size"]["measured"] == pytest.approx(0.0368, abs=1e-4)
    assert g["swap_host_ttft_linear_max_residual"]["met"] is True
    assert "on_demand_vllm_ttft_linear_max_residual" not in g  # a goal of Thaw's tiers only
    assert report["goals_not_met"] == ["swap_host_weights_over_mapped_copy_from_1GiB",
                                       "swap_host_eager_vs_baseline_eager_every_size"]
    assert set(report["sizes"]) == {"256MiB", "1GiB", "4GiB"}


def test_weights_seconds_prefers_the_swap_step() -> None:
    assert bench.weights_seconds({"load_s": 0.6, "swap_steps_s": {"weights_s": 0.7}}) == 0.7
    assert bench.weights_seconds({"load_s": 0.6}) == 0.6
    assert bench.weights_seconds({}) is None
    summary = bench.summarize_variant([{"ttft_s": 1.0, "swap_steps_s": {"weights_s": 0.5, "frontend_s": 0.2},
                                        "park_steps_s": None},
                                       {"ttft_s": 1.2, "swap_steps_s": {"weights_s": 0.7, "frontend_s": 0.1},
                                        "park_steps_s": {"prefix_cache_s": 0.003, "total_s": 0.003}}])
    assert summary["median_weights_s"] == pytest.approx(0.6)
    assert summary["swap_step_medians_s"] == {"weights_s": pytest.approx(0.6), "frontend_s": pytest.approx(0.15)}
    # A rep after a park carries its steps; the first swap of a built engine has none.
    assert summary["park_step_medians_s"] == {"prefix_cache_s": 0.003, "total_s": 0.003}


def test_the_copy_reference_measures_both_kinds_of_memory() -> None:
    from loadtests.cold_start_curve import copy_reference

    ref = copy_reference(8 << 20, reps=1, threads=[1])
    assert ref["bytes"] == 8 << 20 and ref["threads_swept"] == [1]
    assert ref["mapped_gbps"] > 0 and ref["fresh_gbps"] > 0 and ref["mapped_threads"] == 1


def test_sizes_on_the_command_line() -> None:
    import argparse

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    a = p.parse_args(["--out", "x.json", "--sizes", "256MiB", "1GiB", "4GiB"])
    assert a.sizes == ["256MiB", "1GiB", "4GiB"]
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x.json", "--size", "256MiB", "--sizes", "1GiB"])
