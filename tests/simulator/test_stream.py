"""Traces read a chunk at a time: the same run as the whole trace, the production-scale
day drawn the same way whichever chunk is asked for, and a stream whose length does not
change the memory a run holds."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import samples as samples_mod
from simulator.run import with_trace_models
from simulator.sim import Simulator
from simulator.stream import ProductionDay, chunked, read_stream
from tests.simulator.support import config, costs, equivalence_cfg, trace


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.integers(0, 11), rows=st.sampled_from([1, 2, 7, 1000]), exact=st.booleans(),
       arrivals=st.lists(st.tuples(st.sampled_from([0.0, 1.0, 5.0, 30.0, 31.0, 200.0, 201.5, 400.0]),
                                   st.integers(0, 3), st.integers(1, 4000), st.integers(1, 400)),
                         min_size=1, max_size=50))
def test_a_trace_read_in_chunks_runs_as_the_whole_trace(variant: int, rows: int, exact: bool,
                                                        arrivals: list[tuple[float, int, int, int]]) -> None:
    """Arrivals of one instant split across chunks still wake the controller once; what
    waits in a queue across a chunk's end keeps its arrival and tokens."""
    cfg = equivalence_cfg(variant)
    tr = trace([(t, f"m{m}", i, o) for t, m, i, o in arrivals])
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    whole = Simulator(cfg, c, tr, exact=exact, record_decisions=True).run()
    streamed_sim = Simulator(cfg, c, chunked(tr, rows), exact=exact, record_decisions=True)
    streamed = streamed_sim.run()
    assert streamed.decisions == whole.decisions and streamed.summary == whole.summary
    assert streamed.cold_starts == whole.cold_starts and streamed.end_s == whole.end_s
    assert streamed_sim.requests == len(tr)


def test_on_admit_hears_trace_indexes_across_chunks() -> None:
    cfg = config(max_concurrency_per_replica=1)
    tr = trace([(0.0, "m0", 10, 10), (0.0, "m0", 10, 10), (50.0, "m0", 10, 10), (60.0, "m0", 10, 10)])
    heard: dict[int, float] = {}
    sim = Simulator(cfg, costs(cfg), chunked(tr, 1), on_admit=heard.__setitem__)
    sim.run()
    assert sorted(heard) == [0, 1, 2, 3] and sim.traffic.cold_requests == [0, 1]


def test_the_production_day_is_the_same_whichever_chunk_is_drawn() -> None:
    day = ProductionDay(big_rps=50.0, tail_models=30, tail_rate_per_hour=600.0, duration_s=35.0, chunk_s=10.0, seed=3)
    chunks = list(day.chunks())
    assert len(chunks) == 4 and chunks[3].t and chunks[3].t[-1] < 35.0
    assert day.chunk(2) == chunks[2] and ProductionDay.from_json(day.to_json()).chunk(1) == chunks[1]
    assert ProductionDay(big_rps=50.0, tail_models=30, tail_rate_per_hour=600.0, duration_s=35.0, chunk_s=10.0,
                         seed=4).chunk(1) != chunks[1]
    for k, ch in enumerate(chunks):
        assert ch.models == day.models and all(10.0 * k <= t <= 10.0 * (k + 1) for t in ch.t)
        assert ch.t == sorted(ch.t) and min(ch.input_tokens) >= 1 and min(ch.output_tokens) >= 1


def test_the_production_day_follows_the_day_at_its_rates() -> None:
    """An hour at the peak and an hour at the trough: the busy model's counts are its
    rate x (1 ± a) within 5 sigma, the tail's its mean over models."""
    day = ProductionDay(big_rps=40.0, tail_models=200, tail_rate_per_hour=60.0, chunk_s=600.0, seed=1)
    a = (4 - 1) / (4 + 1)
    for hour, factor in ((14, 1 + a), (2, 1 - a)):
        k0 = int(hour * 3600 / 600)
        chunks = [day.chunk(k) for k in range(k0, k0 + 6)]
        model = np.concatenate([np.asarray(c.model) for c in chunks])
        big = int(np.sum(model == 0))
        want = 40.0 * 3600 * _hour_mean(hour, a)
        assert abs(big - want) < 5 * math.sqrt(want), (hour, big, want)
        assert abs(_hour_mean(hour, a) - factor) < 0.02  # the hour is at the peak, or the trough
    assert day.mean_rps == pytest.approx(40.0 + 200 * 60.0 / 3600)
    assert day.models[0] == "llama-70b" and day.models[1:3] == ["m000", "m001"]


def _hour_mean(hour: int, a: float) -> float:
    """The mean of 1 + a cos(2 pi (t - 14 h) / 24 h) over [hour, hour + 1) h."""
    w = 2 * math.pi / 24
    return 1 + a * (math.sin(w * (hour + 1 - 14)) - math.sin(w * (hour - 14))) / w


def test_a_description_reads_back_and_other_files_are_not_streams(tmp_path: Path) -> None:
    day = ProductionDay(big_rps=5.0, tail_models=3, seed=9)
    path = tmp_path / "day.json"
    path.write_text(json.dumps(day.to_json()))
    assert read_stream(path) == day
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp,model,tenant,input_tokens,output_tokens\n0,m,default,1,1\n")
    assert read_stream(csv) is None
    jsonl = tmp_path / "mooncake.jsonl"  # starts with "{" too, and is no description
    jsonl.write_text("".join(f'{{"timestamp": {i}, "input_length": 10, "output_length": 5}}\n' for i in range(3000)))
    assert read_stream(jsonl) is None
    other = tmp_path / "other.json"
    other.write_text('{"models": []}')
    assert read_stream(other) is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**day.to_json(), "big_rps": -1}))
    with pytest.raises(ValueError, match=r"bad.json: big_rps must be a positive number"):
        read_stream(bad)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**day.to_json(), "rps": 3}))
    with pytest.raises(ValueError, match=r"unknown parameters of the production scenario: \['rps'\]"):
        read_stream(unknown)


def test_a_longer_stream_holds_no_more_memory_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four times the duration, about the same peak of memory: chunks are read and
    dropped, and TTFT samples fold into their histogram (with every request's tokens
    alike, a few buckets). What may grow is one record per cold start and the
    policy's windows: far under the 8 bytes a request that a kept TTFT alone would
    cost, let alone a kept request (100 bytes or more)."""
    monkeypatch.setattr(samples_mod, "EXACT_MAX", 500)

    def peak(duration_s: float) -> tuple[int, int]:
        day = ProductionDay(big_rps=60.0, tail_models=4, tail_rate_per_hour=1800.0, duration_s=duration_s,
                            chunk_s=60.0, peak_hour=0.0, token_sigma=0.0)
        cfg = with_trace_models(config(max_concurrency_per_replica=64, standby_min=2, standby_max=4, max_instances=8), day,
                                "m0")
        sim = Simulator(cfg, costs(cfg, prefill=100_000, tpot_s=0.0001), day)
        tracemalloc.start()
        try:
            r = sim.run()
            held = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        s = r.summary["per_model"]["llama-70b"]
        # Nearly every request has a TTFT (those of the first cold start's queue overflow).
        assert duration_s < 300 or s["activation_timeouts"] + s["queue_full"] < 0.1 * s["requests"]
        return held, sim.requests

    peak(30.0)  # what a first run allocates once (imports, caches)
    short, n_short = peak(300.0)
    long, n_long = peak(1200.0)
    assert n_long - n_short > 50_000
    assert (long - short) / (n_long - n_short) < 3.0, (short, long, n_short, n_long)


def test_the_cli_writes_a_description_and_simulates_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    day_file = tmp_path / "day.json"
    assert main(["simulate", "gen", "production", "--duration", "120", "--big-rps", "3", "--big-model", "big",
                 "--tail-models", "5", "--tail-rate-per-hour", "360", "--seed", "2", "--out", str(day_file)]) == 0
    assert "about 420 requests, 6 models" in capsys.readouterr().out
    day = read_stream(day_file)
    assert day == ProductionDay(duration_s=120.0, big_model="big", big_rps=3.0, tail_models=5,
                                tail_rate_per_hour=360.0, seed=2)
    cfg_file = tmp_path / "thaw.yaml"
    cfg_file.write_text(json.dumps(json.loads(config().model_dump_json(exclude={"data_dir"}))))
    out = tmp_path / "out"
    args = ["simulate", "--trace", str(day_file), "--config", str(cfg_file), "--model-template", "m0"]
    assert main([*args, "--out-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    drawn = sum(len(c) for c in day.chunks())
    assert summary["requests"] == drawn and "big" in summary["per_model"]
    run = json.loads((out / "run.json").read_text())
    assert run["trace"]["requests"] == drawn and 0 < run["trace"]["duration_s"] <= 120
    # The same description, the same answer.
    assert main([*args, "--out-dir", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "summary.json").read_text()) == summary
    capsys.readouterr()
    assert main([*args, "--sweep", "--out-dir", str(tmp_path / "sweep")]) == 2
    assert "runs as one simulation" in capsys.readouterr().err
    assert main(["simulate", "gen", "production", "--big-rps", "0", "--out", str(day_file)]) == 2
    assert "big_rps must be a positive number" in capsys.readouterr().err


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.integers(0, 11), conc=st.integers(1, 4),
       arrivals=st.lists(st.tuples(st.floats(0, 300, allow_nan=False), st.integers(0, 3), st.integers(1, 4000),
                                   st.integers(1, 400)), min_size=1, max_size=80))
def test_the_slot_heap_picks_as_a_scan_of_the_ready_replicas(variant: int, conc: int,
                                                            arrivals: list[tuple[float, int, int, int]]) -> None:
    """Every pick of a run, from the heap, is the replica a scan of ``m.ready`` picks."""
    from simulator.traffic import Traffic, least_loaded

    cfg = equivalence_cfg(variant)
    cfg = cfg.model_copy(update={"models": [m.model_copy(update={"autoscaling": m.autoscaling.model_copy(
        update={"max_concurrency_per_replica": conc})}) for m in cfg.models]})
    tr = trace([(round(t, 3), f"m{m}", i, o) for t, m, i, o in arrivals])
    sim = Simulator(cfg, costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2), tr)
    picks = 0
    heap_pick = Traffic.pick

    def checked(self: Traffic, m: Any) -> Any:
        nonlocal picks
        got = heap_pick(self, m)
        assert got is least_loaded(m)
        picks += 1
        return got

    sim.traffic.pick = checked.__get__(sim.traffic)  # type: ignore[method-assign]
    sim.run()
    assert picks >= 1
