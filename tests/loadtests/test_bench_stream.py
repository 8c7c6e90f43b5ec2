"""`thaw bench stream`: the ceiling grid's arithmetic, the report, and the plain-GET reader
against a real SeaweedFS (bytes read, not speed)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtests import bench_stream as bench
from loadtests.bench_stream import GridPoint as P
from thaw.objstore import S3Endpoint
from thaw.units import GiB, MiB
from weight_streaming.manifest import parse_s3_uri

# --- the grid -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "concs", "want"),
    [
        ([16], [8], [P(16, 8)]),
        # each value once, ascending; chunk-major
        ([32, 8, 8], [16, 4], [P(8, 4), P(8, 16), P(32, 4), P(32, 16)]),
    ],
)
def test_grid_is_every_chunk_by_every_concurrency(chunks: list[int], concs: list[int], want: list[P]) -> None:
    assert list(bench.ceiling_grid(chunks, concs)) == want


def test_default_grid_is_20_points() -> None:
    grid = bench.ceiling_grid(bench.CEILING_CHUNKS_MIB, bench.CEILING_CONCURRENCY)
    assert len(grid) == 20  # 5 chunk sizes x 4 concurrencies
    assert (grid[0], grid[-1]) == (P(4, 4), P(64, 32))
    assert grid[0].chunk_bytes == 4 * MiB and str(grid[-1]) == "64 MiB x 32"


@pytest.mark.parametrize(("chunks", "concs"), [([0, 16], [8]), ([16], [-1])])
def test_grid_refuses_values_below_one(chunks: list[int], concs: list[int]) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        bench.ceiling_grid(chunks, concs)


def test_cli_grid_flags_and_defaults() -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    a = p.parse_args(["--out", "x.json"])
    assert a.ceiling_chunks_mib == [4, 8, 16, 32, 64] and a.ceiling_concurrency == [4, 8, 16, 32]
    assert (a.reps, a.size, a.ceiling_reader, a.sweep) == (3, "1GiB", "http_readinto", False)
    a = p.parse_args(["--out", "x.json", "--ceiling-chunks-mib", "8", "64", "--ceiling-concurrency", "4",
                      "--ceiling-reader", "read_amt", "--skip", "ceiling"])
    assert (a.ceiling_chunks_mib, a.ceiling_concurrency, a.ceiling_reader) == ([8, 64], [4], "read_amt")
    assert a.skip == ["ceiling"]
    for bad in (["--ceiling-chunks-mib", "0"], ["--ceiling-concurrency", "x"], ["--ceiling-reader", "mmap"],
                ["--reps", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(["--out", "x.json", *bad])


def test_unknown_skip_is_refused_with_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args(["--skip", "nope"])) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "ceiling" in err and "thaw_cached" in err


# --- ranges and buffers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "chunk", "want"),
    [
        ([10], 10, [(0, 0, 10)]),
        # 25 bytes in 10s: 10 + 10 + 5; an empty object has no range
        ([10, 0, 25], 10, [(0, 0, 10), (2, 0, 10), (2, 10, 10), (2, 20, 5)]),
        ([3], 1 << 20, [(0, 0, 3)]),
    ],
)
def test_ranges_cover_every_byte_at_chunk_multiples(
    sizes: list[int], chunk: int, want: list[tuple[int, int, int]]
) -> None:
    got = bench.plan_ranges(sizes, chunk)
    assert got == want
    for i, size in enumerate(sizes):
        assert sum(n for j, _, n in got if j == i) == size


@pytest.mark.parametrize(
    ("sizes", "chunk", "conc", "want"),
    [
        ([25], 10, 8, 30),  # 3 ranges, so 3 threads get work, x the longest range (10)
        ([25], 10, 2, 20),  # 2 threads x 10
        ([5], 10, 4, 5),  # one short range: one thread x 5
        ([], 10, 4, 0),
    ],
)
def test_arena_is_working_threads_times_longest_range(sizes: list[int], chunk: int, conc: int, want: int) -> None:
    assert bench.arena_bytes(sizes, chunk, conc) == want


def test_prefaulted_buffer_has_the_size_asked() -> None:
    assert len(bench.prefaulted(3 * 4096 + 1)) == 3 * 4096 + 1


# --- the interleaved schedule ---------------------------------------------------------


def test_schedule_spreads_loaders_among_grid_points_and_rotates() -> None:
    pts = [P(4, 4), P(8, 4), P(16, 4), P(32, 4)]
    # rep 0: loaders at 1/4 and 3/4 of the way, points at 1/8, 3/8, 5/8, 7/8
    assert bench.schedule(["a", "b"], pts, 0, 2) == [pts[0], "a", pts[1], pts[2], "b", pts[3]]
    # rep 1 of 2: each list rotated half way (loaders by 1, points by 2)
    assert bench.schedule(["a", "b"], pts, 1, 2) == [pts[2], "b", pts[3], pts[0], "a", pts[1]]


@pytest.mark.parametrize("rep", [0, 1, 2])
def test_schedule_runs_everything_once_per_rep(rep: int) -> None:
    grid = bench.ceiling_grid(bench.CEILING_CHUNKS_MIB, bench.CEILING_CONCURRENCY)
    order = bench.schedule(bench.LOADERS, grid, rep, 3)
    assert sorted(map(str, order)) == sorted(map(str, [*bench.LOADERS, *grid]))


def test_schedule_with_only_loaders_or_only_points() -> None:
    assert bench.schedule(["a", "b", "c"], [], 1, 3) == ["b", "c", "a"]
    assert bench.schedule([], [P(4, 4), P(8, 4)], 0, 1) == [P(4, 4), P(8, 4)]


# --- the ceiling and the ratios -------------------------------------------------------

# 1 GiB model. 16 MiB x 16 (Thaw's default): 1, 2, 4 s -> median 2 s -> 0.5 GiB/s.
# 64 MiB x 4: 0.5, 0.8, 1 s -> median 0.8 s -> 1.25 GiB/s, the ceiling.
GRID_SECONDS = {P(16, 16): [1.0, 2.0, 4.0], P(64, 4): [0.5, 0.8, 1.0]}
GRID_CPU = {P(16, 16): [0.4, 0.5, 0.6], P(64, 4): [0.45, 0.45, 0.5]}


def test_ceiling_is_the_highest_median_over_the_grid() -> None:
    c = bench.summarize_grid(GiB, GRID_SECONDS, GRID_CPU, thaw_point=P(16, 16))
    assert c["gib_per_s"] == 1.25
    assert c["best"] == {"chunk_mib": 64, "concurrency": 4}
    assert c["at_thaw_settings"] == {"chunk_mib": 16, "concurrency": 16, "gib_per_s": 0.5}
    # the whole grid is kept, in grid order, with its samples
    assert [(r["chunk_mib"], r["concurrency"]) for r in c["grid"]] == [(16, 16), (64, 4)]
    first = c["grid"][0]
    assert first["seconds_median"] == 2.0 and first["samples_gib_per_s"] == [1.0, 0.5, 0.25]
    assert first["client_cpu_s_per_gib"] == 0.5  # median CPU 0.5 s / 1 GiB


def test_ceiling_of_nothing_measured() -> None:
    c = bench.summarize_grid(GiB, {}, thaw_point=P(16, 16))
    assert c == {"gib_per_s": None, "best": None, "at_thaw_settings": None, "grid": []}


def test_thaw_settings_outside_the_grid_have_no_point() -> None:
    assert bench.summarize_grid(GiB, GRID_SECONDS, thaw_point=P(8, 8))["at_thaw_settings"] is None


@pytest.mark.parametrize(
    ("rates", "want"),
    [
        ([1.0, 2.0, 0.5], 1),
        ([1.0, 2.0, 2.0], 1),  # a tie keeps the earlier point
        ([3.0], 0),
    ],
)
def test_best_point(rates: list[float], want: int) -> None:
    rows = [{"gib_per_s": r, "i": i} for i, r in enumerate(rates)]
    best = bench.best_point(rows)
    assert best is not None and best["i"] == want
    assert bench.best_point([]) is None


RESULTS = {
    "thaw": {"gib_per_s": 0.75},
    "thaw_prefaulted": {"gib_per_s": 1.0},
    "runai": {"gib_per_s": 0.2},
    "runai_defaults": {"gib_per_s": 0.25},
    "boto3_safetensors": {"gib_per_s": 0.375},
    "thaw_cached": {"gib_per_s": 3.0},
}


def test_every_loader_against_the_ceiling_and_thaw_against_the_others() -> None:
    ceiling = bench.summarize_grid(GiB, GRID_SECONDS, thaw_point=P(16, 16))  # 1.25; 0.5 at 16 x 16
    r = bench.compute_ratios(RESULTS, ceiling)
    assert r["thaw_vs_ceiling"] == 0.6  # 0.75 / 1.25
    assert r["thaw_prefaulted_vs_ceiling"] == 0.8  # 1.0 / 1.25
    assert r["runai_vs_ceiling"] == 0.16  # 0.2 / 1.25
    assert r["runai_defaults_vs_ceiling"] == 0.2  # 0.25 / 1.25
    assert r["boto3_safetensors_vs_ceiling"] == 0.3  # 0.375 / 1.25
    assert r["thaw_cached_vs_ceiling"] == 2.4  # 3.0 / 1.25: beyond the network
    assert r["thaw_cache_miss_vs_ceiling"] is None  # not measured
    assert r["thaw_vs_ceiling_at_thaw_settings"] == 1.5  # 0.75 / 0.5
    assert r["thaw_vs_runai"] == 3.0  # 0.75 / max(0.2, 0.25)
    assert r["thaw_vs_boto3_safetensors"] == 2.0  # 0.75 / 0.375
    assert r["thaw_cached_vs_thaw"] == 4.0  # 3.0 / 0.75
    assert r["thaw_cache_miss_vs_thaw"] is None


def test_without_a_ceiling_no_ratio_to_it() -> None:
    r = bench.compute_ratios(RESULTS, bench.summarize_grid(GiB, {}))
    assert all(v is None for k, v in r.items() if "ceiling" in k)
    assert r["thaw_vs_runai"] == 3.0


def test_sweep_pairs_thaw_with_plain_gets_per_point() -> None:
    pts = [P(16, 8), P(32, 8)]
    runs = {(pts[0], "plain_gets"): [1.0, 1.0], (pts[0], "thaw"): [2.0, 2.0],
            (pts[1], "plain_gets"): [0.5, 1.5], (pts[1], "thaw"): [1.0, 1.0]}
    rows = bench.summarize_sweep(GiB, runs, pts)
    assert [(r["plain_gets_gib_per_s"], r["thaw_gib_per_s"], r["thaw_vs_plain_gets"]) for r in rows] == [
        (1.0, 0.5, 0.5),  # 1 GiB / 1 s, 1 GiB / 2 s
        (1.0, 1.0, 1.0),  # median of 0.5 and 1.5 is 1 s
    ]


def _report() -> dict:
    return bench.build_report(
        parameters={"size": "1GiB", "reps": 3, "chunk_bytes": 16 * MiB, "concurrency": 16},
        environment={"cpu_count": 2, "store": "test", "load_average_before": [1.0, 1, 1],
                     "load_average_after": [2.0, 1, 1]},
        model={"safetensors_files": 1, "safetensors_bytes": GiB},
        ceiling=bench.summarize_grid(GiB, GRID_SECONDS, GRID_CPU, thaw_point=P(16, 16)),
        results={k: {**v, "seconds_median": 1 / v["gib_per_s"], "samples_s": []} for k, v in RESULTS.items()},
        correctness={"thaw_equals_safetensors_bit_for_bit": True, "tensors": 3},
        timings={"setup_seconds": 12.34, "warmup_seconds": 0.96},
    )


def test_report_keeps_the_grid_and_names_the_best_point() -> None:
    report = _report()
    assert set(report) >= {"benchmark", "environment", "parameters", "model", "ceiling", "results", "ratios",
                           "sweep", "correctness", "setup_seconds", "warmup_seconds"}
    c = report["ceiling"]
    assert (c["gib_per_s"], c["best"], c["reader"]) == (1.25, {"chunk_mib": 64, "concurrency": 4}, "http_readinto")
    assert len(c["grid"]) == 2 and "median" in c["statistic"] and c["method"].startswith("plain")
    assert "ceiling" not in report["results"]  # the ceiling is not one of the loaders
    assert report["ratios"]["thaw_vs_ceiling"] == 0.6
    assert (report["setup_seconds"], report["warmup_seconds"]) == (12.3, 1.0)
    json.dumps(report)  # serialisable as is


def test_summary_shows_the_grid_the_ceiling_and_the_ratios() -> None:
    text = bench._summary(_report())
    assert "ceiling: 1.250 GiB/s at 64 MiB x 4 GETs" in text
    assert "1.25*" in text  # the best cell is marked
    assert "thaw_vs_ceiling" in text and "0.600" in text


# --- against a real store: the reader reads every byte ---------------------------------


@dataclass(frozen=True)
class Obj:
    bucket: str
    key: str
    size: int


def _put(s3: S3Endpoint, s3_prefix: str, sizes: dict[str, int]) -> tuple[object, list[Obj], dict[str, bytes]]:
    client = s3.client(max_pool_connections=4)
    bucket, prefix = parse_s3_uri(s3_prefix)
    data = {f"{prefix}/{name}": os.urandom(n) for name, n in sizes.items()}
    for key, body in data.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    return client, [Obj(bucket, k, len(v)) for k, v in data.items()], data


@pytest.mark.integration
@pytest.mark.parametrize("reader", sorted(bench.READERS))
def test_plain_gets_read_every_byte_over_a_tiny_grid(s3: S3Endpoint, s3_prefix: str, reader: str) -> None:
    # 2.5 MiB + 1 byte, and 100 bytes: ranges of 1 and 2 MiB leave a short last range.
    _, objs, _ = _put(s3, s3_prefix, {"a.safetensors": 5 * MiB // 2 + 1, "b.safetensors": 100})
    for point in bench.ceiling_grid([1, 2], [1, 3]):
        client = s3.client(max_pool_connections=point.concurrency)
        run = bench.read_all_ranged(client, objs, point.chunk_bytes, point.concurrency,
                                    reader=bench.READERS[reader])
        assert run.bytes_by_key == {o.key: o.size for o in objs}, point
        assert run.requests == len(bench.plan_ranges([o.size for o in objs], point.chunk_bytes))
        assert run.seconds > 0 and run.cpu_s >= 0


@pytest.mark.integration
@pytest.mark.parametrize("reader", sorted(bench.READERS))
def test_each_reader_lands_the_objects_bytes_in_the_buffer(s3: S3Endpoint, s3_prefix: str, reader: str) -> None:
    # One thread and a range as long as the object: the arena ends up holding the object.
    _, (obj,), data = _put(s3, s3_prefix, {"x.safetensors": 300_001})
    arena = bench.prefaulted(bench.arena_bytes([obj.size], MiB, 1))
    bench.read_all_ranged(s3.client(max_pool_connections=1), [obj], MiB, 1,
                          reader=bench.READERS[reader], arena=arena)
    assert bytes(arena[: obj.size]) == data[obj.key]


@pytest.mark.integration
@pytest.mark.parametrize("reader", sorted(bench.READERS))
def test_readers_hand_connections_back_to_the_pool(s3: S3Endpoint, s3_prefix: str, reader: str) -> None:
    # 8 ranges over 2 threads: a reader that dropped connections would open one per GET.
    _, objs, _ = _put(s3, s3_prefix, {"x.safetensors": 8 * 1000})
    client = s3.client(max_pool_connections=2)
    sent: list[object] = []
    client.meta.events.register("before-send.s3.GetObject", lambda **kw: sent.append(kw))
    run = bench.read_all_ranged(client, objs, 1000, 2, reader=bench.READERS[reader])
    assert run.requests == len(sent) == 8
    pools = client._endpoint.http_session._manager.pools
    (key,) = pools.keys()
    assert pools[key].num_connections <= 2


@pytest.mark.integration
def test_bench_measures_the_grid_interleaved_with_thaw(s3: S3Endpoint, s3_prefix: str, tmp_path: Path,
                                                       demo_model_dir: Path) -> None:
    """_Bench on the tiny demo model: one rep of Thaw and of a 2-point grid; the report's
    ceiling is one of the grid's points. Times are printed, not asserted."""
    from weight_streaming.push import push_model

    client = s3.client(max_pool_connections=8, response_checksum_validation="when_required",
                       request_checksum_calculation="when_required")
    push_model(client, demo_model_dir, s3_prefix)
    b = bench._Bench(tmp_path, s3, client, s3_prefix, demo_model_dir, 1 * MiB, 2)
    grid = bench.ceiling_grid([1, 4], [2])
    b.warm_up(grid)
    results, samples = b.measure(1, set(bench.LOADERS) - {"thaw"}, grid)
    assert set(results) == {"thaw"} and all(len(samples["seconds"][p]) == 1 for p in grid)
    ceiling = bench.summarize_grid(b.total_bytes, samples["seconds"], samples["cpu_s"], thaw_point=P(1, 2))
    assert (ceiling["best"]["chunk_mib"], ceiling["best"]["concurrency"]) in {(1, 2), (4, 2)}
    assert ceiling["at_thaw_settings"]["chunk_mib"] == 1
    ratios = bench.compute_ratios(results, ceiling)
    assert ratios["thaw_vs_ceiling"] is not None and ratios["thaw_vs_ceiling"] > 0
    print(f"\nceiling {ceiling['gib_per_s']} GiB/s at {ceiling['best']}, thaw/ceiling {ratios['thaw_vs_ceiling']}")
