"""`thaw bench cold-start`: the report's arithmetic on recorded samples, and one real smoke run."""

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
    {"ttft_s": 2.0, "phases_s": {"weights_loaded": 0.8, "engine_ready": 0.7}},
    {"ttft_s": 3.0, "phases_s": {"weights_loaded": 1.0, "engine_ready": 0.9}},
    {"ttft_s": 2.2, "phases_s": {"weights_loaded": 0.9, "engine_ready": 0.8}},
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
    assert (s["reps"], s["failed"]) == (len(samples), failed)


def test_phase_medians_per_phase() -> None:
    s = bench.summarize_variant(EAGER_SAMPLES)
    # weights_loaded: 0.8, 0.9, 1.0 -> 0.9; engine_ready: 0.7, 0.8, 0.9 -> 0.8
    assert s["phase_medians_s"] == {"weights_loaded": 0.9, "engine_ready": 0.8}


def test_ratios_are_thaw_medians_over_the_baseline_median() -> None:
    r = bench.compute_ratios({bench.BASELINE: 44.0, bench.EAGER: 2.2, bench.SNAPSHOT: 5.5, bench.NO_SNAPSHOT: None})
    assert r == {
        "standby_eager_vs_baseline": 0.05,  # 2.2 / 44
        "standby_snapshot_vs_baseline": 0.125,  # 5.5 / 44
        "standby_no_snapshot_vs_baseline": None,  # not run
    }
    # Without a baseline nothing can be compared.
    assert set(bench.compute_ratios({bench.EAGER: 2.2}).values()) == {None}


def test_report_shape_and_goals() -> None:
    report = bench.build_report({bench.BASELINE: BASELINE_SAMPLES, bench.EAGER: EAGER_SAMPLES},
                                environment={"cpu_count": 2}, settings={"reps": 3})
    assert set(report) >= {"environment", "settings", "variants", "ratios", "goals"}
    eager = report["variants"][bench.EAGER]
    assert eager["samples"] == EAGER_SAMPLES and eager["median_ttft_s"] == 2.2 and eager["description"]
    assert report["ratios"]["standby_eager_vs_baseline"] == 0.05
    assert report["goals"]["standby_eager_vs_baseline"] == {"at_most": 0.08, "measured": 0.05, "met": True}
    assert report["goals"]["standby_snapshot_vs_baseline"]["met"] is None
    json.dumps(report)  # serialisable as is


def test_cli_arguments_and_defaults() -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    a = p.parse_args(["--out", "x.json"])
    assert (a.reps, a.variants, a.size, a.load_format) == (3, list(bench.VARIANTS), "tiny", "thaw")
    a = p.parse_args(["--out", "x.json", "--reps", "1", "--variants", "standby_eager", "baseline"])
    assert a.variants == ["standby_eager", "baseline"]
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x.json", "--variants", "hot"])


@pytest.mark.integration
@pytest.mark.engine
def test_smoke_one_eager_rep_against_an_eager_baseline(store: EmbeddedStore, tmp_path: Path) -> None:
    """The real thing, small: one rep of the eager baseline and of Thaw's eager tier on
    the tiny model (about a minute here). Times are printed, not asserted."""
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "cold.json"
    args = p.parse_args([
        "--out", str(out), "--reps", "1", "--variants", "baseline", "standby_eager", "--baseline-eager",
        "--work-dir", str(tmp_path / "work"), "--bucket", store.bucket, "--timeout-s", "300",
        "--s3-endpoint-url", store.endpoint().endpoint_url, "--s3-credentials-file",
        str(store.root / "credentials.json"),
    ])
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    base, eager = report["variants"]["baseline"], report["variants"]["standby_eager"]
    assert base["failed"] == eager["failed"] == 0
    (b,), (e,) = base["samples"], eager["samples"]
    assert e["cold_header"] == "true" and e["request_id"].startswith("bench-")
    # The activator's phases of this very request, and they add up to its TTFT.
    assert set(e["phases_s"]) == {"queued", "instance_acquired", "snapshot_restored", "weights_loaded",
                                  "engine_ready", "first_token"}
    assert abs(sum(e["phases_s"].values()) - e["activator_total_s"]) < 0.05
    assert report["ratios"]["standby_eager_vs_baseline"] == round(e["ttft_s"] / b["ttft_s"], 4)
    assert report["environment"]["model"]["size"] == "tiny"
    print(f"\nbaseline {b['ttft_s']:.2f}s, standby eager {e['ttft_s']:.2f}s, phases {e['phases_s']}")
