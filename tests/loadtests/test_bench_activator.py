"""`thaw bench activator`: the report's arithmetic, the fast upstream, and one short real run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from loadtests import bench_activator as bench
from loadtests.fast_upstream import Upstream, serve
from thaw.embedded_store import free_port


def samples(latencies_ms: list[float], ttft_ms: float = 1.0) -> list[bench.Sample]:
    return [bench.Sample(True, ttft_ms / 1000, lat / 1000, 32) for lat in latencies_ms]


def test_summary_percentiles_and_rates() -> None:
    # 100 requests with latencies 1..100 ms over 2 s: p50 is the 50th value of the
    # sorted list (index round(0.5 * 99) = 50 -> 51 ms), p99 index round(0.99 * 99) = 98 -> 99 ms.
    point = bench.summarize(samples([float(i) for i in range(1, 101)]), 50.0, 2.0, 2.0, 0.2)
    assert point["latency_p50_ms"] == pytest.approx(51.0)
    assert point["latency_p99_ms"] == pytest.approx(99.0)
    assert point["achieved_rps"] == 50.0  # 100 ok / 2 s
    assert point["tokens_per_s"] == 1600.0  # 100 x 32 / 2 s
    assert point["proxy_cpu_ms_per_request"] == pytest.approx(2.0)  # 0.2 s / 100


def test_failures_count_as_errors_not_latency() -> None:
    s = samples([1.0, 2.0]) + [bench.Sample(False, 0.0, 0.5, 0, "502: bad")]
    point = bench.summarize(s, 10.0, 1.0, 1.0, None)
    assert point["errors"] == 1 and point["error_examples"] == ["502: bad"]
    assert point["latency_p99_ms"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("proxy_p99", "errors", "ok"),
    [
        (14.0, 0, True),   # 14 - 5 = 9 ms added < 10
        (15.0, 0, False),  # 15 - 5 = 10 ms added: not under the budget
        (6.0, 1, False),   # any error fails the rate
    ],
)
def test_sustained_needs_no_errors_and_added_p99_under_budget(proxy_p99: float, errors: int, ok: bool) -> None:
    direct = {"latency_p50_ms": 2.0, "latency_p99_ms": 5.0, "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0}
    proxy = {"latency_p50_ms": 4.0, "latency_p99_ms": proxy_p99, "ttft_p50_ms": 2.0, "ttft_p99_ms": 3.0,
             "errors": errors}
    proxy.update(bench.added(proxy, direct))
    assert proxy["added_latency_p50_ms"] == 2.0
    assert bench.sustained(proxy, 10.0) is ok


def test_repeats_pair_by_time_and_a_rate_counts_only_if_every_time_sustained() -> None:
    def pt(rate: float, rep: int, ok: bool, cpu: float) -> dict[str, object]:
        return {"offered_rps": rate, "repeat": rep, "sustained": ok, "proxy_cpu_ms_per_request": cpu,
                "added_latency_p50_ms": 1.0, "added_latency_p99_ms": 2.0, "latency_p50_ms": 2.0,
                "tokens_per_s": 100.0, "errors": 0}

    direct = [{"offered_rps": r, "repeat": k, "latency_p50_ms": 1.0, "tokens_per_s": 100.0}
              for r in (50.0, 100.0) for k in (0, 1)]
    untraced = [pt(50, 0, True, 1.0), pt(50, 1, True, 2.0), pt(100, 0, True, 1.0), pt(100, 1, False, 1.0)]
    traced = [pt(50, 0, True, 1.1), pt(50, 1, True, 2.4), pt(100, 0, True, 1.0), pt(100, 1, True, 1.0)]
    results = {"direct": direct, "activator": untraced, "activator_traced": traced}
    summary = {t: bench._target_summary(results[t], direct) for t in ("activator", "activator_traced")}
    assert summary["activator"]["max_sustained_rps"] == 50.0  # one of 100's two missed
    assert summary["activator_traced"]["max_sustained_rps"] == 100.0
    assert summary["activator"]["rates_tried"] == [50.0, 100.0]
    ratios = bench._ratios(results, summary)
    # Every pair is steady (no errors, added p50 1 ms), the one that missed its p99 too:
    # 1.1, 1.2, 1.0, 1.0 -> median 1.05.
    assert ratios["traced_untraced_pairs"] == 4
    assert ratios["cpu_ms_per_request_traced_over_untraced_median"] == pytest.approx(1.05)
    untraced[0]["errors"] = 1  # (50, 0) drops out: 1.2, 1.0, 1.0 -> 1.0
    assert bench._ratios(results, summary)["cpu_ms_per_request_traced_over_untraced_median"] == pytest.approx(1.0)


def test_cpu_cost_is_a_fixed_part_and_a_slope() -> None:
    # 20 ms of CPU a second whatever the load, and 0.5 ms a request: 100 req/s -> 0.7 ms
    # per request, 400 -> 0.55, 800 -> 0.525.
    points = [{"offered_rps": r, "achieved_rps": r, "proxy_cpu_ms_per_request": (20 + 0.5 * r) / r}
              for r in (100.0, 400.0, 800.0)]
    cost = bench.cpu_cost(points)
    assert cost is not None and cost["points"] == 3
    assert cost["fixed_ms_per_s"] == pytest.approx(20.0) and cost["ms_per_request"] == pytest.approx(0.5)
    assert bench.cpu_cost(points[:1]) is None  # one rate says nothing of the slope
    assert bench.cpu_cost([points[0], {**points[0], "achieved_rps": 99.0}]) is None  # one rate, repeated
    assert bench.cpu_cost([{**p, "proxy_cpu_ms_per_request": None} for p in points]) is None


async def test_fast_upstream_streams_tokens_usage_and_done() -> None:
    port = free_port()
    ready = asyncio.Event()
    task = asyncio.create_task(serve(Upstream(port, "m", 3, 0.0), ready))
    await ready.wait()
    try:
        got, _ = await bench._load(f"http://127.0.0.1:{port}", 200.0, 0.1, 3, seed=1)
        assert got and all(s.ok and s.tokens == 3 for s in got)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        raw = await reader.read()
        writer.close()
        assert raw.count(b'"text":" tok"') == 2
        assert b'"usage":{"prompt_tokens": 8, "completion_tokens": 2' in raw
        assert raw.rstrip().endswith(b"0")  # the chunked body's last chunk
    finally:
        task.cancel()


@pytest.mark.integration
def test_one_short_real_run_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    args = argparse.Namespace(out=str(out), rates="20", duration_s=1.0, min_requests=10, tokens=4, itl_ms=0.0,
                              p99_budget_ms=1e9,
                              no_router=shutil.which("vllm-router") is None and bench._venv_bin("vllm-router") is None,
                              seed=1, traced_ratio=1.0, repeat=2, activator_workers=1)
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    assert set(report["results"]) >= {"direct", "activator"}
    act = report["results"]["activator"][0]
    assert act["errors"] == 0 and act["requests"] > 5 and act["tokens_per_s"] > 0
    assert act["added_latency_p50_ms"] is not None and act["proxy_cpu_ms_per_request"] > 0
    assert report["summary"]["activator"]["max_sustained_rps"] == 20.0
    assert "max_sustained_rps_activator_over_router" in report["ratios"]
    # Traced at ratio 1: every request's span and its first-token child reached the sink.
    traced = report["tracing"]
    assert traced["requests"] > 5 and traced["spans_received"] >= 2 * traced["requests"]
    assert report["results"]["activator_traced"][0]["errors"] == 0
    # Every prompt of the benchmark is short: its bound decides, none is counted exactly.
    counts = report["prompt_counts"]["activator"]
    assert counts["bound"] >= act["requests"] and counts.get("exact", 0) == 0 and counts["exact_share"] == 0
    # --repeat 2: each target measured twice at the one rate, and paired time by time.
    assert [p["repeat"] for p in report["results"]["activator"]] == [0, 1]
    assert len(bench._common(report["results"], "activator_traced", "activator")) == 2
    # (Which pairs count in the ratios depends on the machine's load: not asserted here.)
    assert report["ratios"]["traced_untraced_pairs"] in (0, 1, 2)
    # The bare proxy streamed the same answers, and the CPU splits at it.
    bare = report["results"]["bare_proxy"][0]
    # (CPU comes in clock ticks: a second of a cheap proxy may fall within one.)
    assert bare["errors"] == 0 and bare["tokens_per_s"] > 0 and bare["proxy_cpu_ms_per_request"] >= 0
    assert "cpu_per_request_activator_over_bare_proxy_median" in report["ratios"]
    assert report["cpu_cost"]["activator"] is None  # one rate, if twice: no slope
    split = act["proxy_cpu_split_ms_per_request"]
    # Each part is counted in clock ticks, the process's and its main thread's read a
    # moment apart: over one short point the rest may come out one tick below zero.
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert split["main_thread"] > 0 and split["other_threads"] >= -tick_ms / act["requests"]
    assert split["user"] + split["system"] == pytest.approx(act["proxy_cpu_ms_per_request"])


def test_bad_rates_or_workers_are_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--rates", "0,50"]) == 2
    assert bench.main(["--activator-workers", "0", "--no-router"]) == 2
    assert "--activator-workers needs at least 1" in capsys.readouterr().err


@pytest.mark.integration
def test_two_activator_workers_serve_the_benchmark_on_one_port(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    args = argparse.Namespace(out=str(out), rates="20", duration_s=1.0, min_requests=40, tokens=4, itl_ms=0.0,
                              p99_budget_ms=1e9, no_router=True, seed=1, traced_ratio=-1.0, repeat=1,
                              activator_workers=2)
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    assert report["params"]["activator_workers"] == 2
    act = report["results"]["activator"][0]
    assert act["errors"] == 0 and act["requests"] >= 40
    assert "activator_traced" not in report["results"] and "prompt_counts" not in report
