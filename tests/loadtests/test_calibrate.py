"""`thaw load calibrate`: the trace, the stack's config, the cost model from samples, the
comparison and the verdict, from tables; the cost phase against a fake stack."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loadtests import load_calibrate as lc
from loadtests.load_schema import (
    CostMeasurements,
    HotSample,
    Interval,
    ReplicaSample,
    RequestRecord,
    TierProbe,
    TraceParams,
)
from simulator.costs import cost_model, read_overrides
from simulator.traces import from_columns, spread_models, write_generic
from thaw.cli.main import main as thaw
from thaw.config import parse_config
from warm_pool.policy.decisions import Assign, Decision, Launch, Release, Terminate

# -- the trace ------------------------------------------------------------------------------


def source(n: int = 1000, every_s: float = 1.0) -> Any:
    """A one-service trace: a request every ``every_s`` s, input i * 10 tokens, output i."""
    return from_columns([i * every_s for i in range(n)], [0] * n, [0] * n, [i * 10 for i in range(n)],
                        list(range(n)), ["azure_llm_2023_conv"], ["default"], "test source")


def params(**kw: Any) -> TraceParams:
    base: dict[str, Any] = dict(source_file="x.csv", start_s=100.0, duration_s=50.0, speedup=4.0, rate_per_s=1.0,
                                models=3, zipf_s=1.0, seed=7, max_input_tokens=1500, max_output_tokens=32)
    return TraceParams(**(base | kw))


def test_the_trace_is_a_compressed_thinned_window_over_the_models() -> None:
    tr = lc.build_trace(source(), params())
    # The window is 50 x 4 = 200 s of the source from 100 s: 200 requests, each kept with
    # probability 1.0 x 50 / 200 = 0.25, then 4x faster: all within the 50 s.
    assert 25 < len(tr) < 75
    assert all(0 <= t < 50 for t in tr.t)
    assert tr.models == lc.model_names(3)
    # Tokens capped, outputs at least 1 (the source's request 100 has 1000 input tokens).
    assert max(tr.input_tokens) <= 1500 and min(tr.input_tokens) >= 1000
    assert max(tr.output_tokens) <= 32 and min(tr.output_tokens) >= 1


def test_the_trace_is_deterministic_by_seed() -> None:
    a, b, c = (lc.build_trace(source(), params(seed=s)) for s in (1, 1, 2))
    assert a == b
    assert a != c


def test_a_window_without_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="no request"):
        lc.build_trace(source(10), params(start_s=500.0))


def test_model_names_are_spread_models_names() -> None:
    tr = spread_models(source(2000), 12, seed=0, prefix=lc.MODEL_PREFIX)
    assert lc.model_names(12) == tr.models
    assert lc.model_names(3) == ["calib-m000", "calib-m001", "calib-m002"]


def test_hot_sizes_spread_over_the_trace_by_input_size() -> None:
    tr = from_columns([0, 1, 2, 3, 4], [0] * 5, [0] * 5, [50, 10, 40, 20, 30], [5, 1, 4, 2, 3], ["m"], ["t"], "")
    # Sorted by input: 10, 20, 30, 40, 50; three picks: the first, the middle, the last.
    assert lc.hot_sizes(tr, 3) == [(10, 1), (30, 3), (50, 5)]
    assert lc.hot_sizes(tr, 1) == [(10, 1)]
    assert lc.hot_sizes(tr, 0) == []


# -- the config ---------------------------------------------------------------------------------


def settings(**kw: Any) -> lc.StackSettings:
    base: dict[str, Any] = {"models": lc.model_names(3), "idle_grace_s": 10.0, "activation_timeout_s": 300.0,
                            "host_cache_gib": 1.0, "disk_cache_gib": 1.0}
    return lc.StackSettings(**(base | kw))


def test_stack_config_parses_and_says_what_the_run_needs(tmp_path: Path) -> None:
    cfg = lc.stack_config(settings(), data_dir=tmp_path / "d", server_port=8001, controller_port=8002, s3_port=8003)
    c = parse_config(cfg)
    assert [m.name for m in c.models] == lc.model_names(3)
    assert len({m.uri for m in c.models}) == 3
    assert all(m.autoscaling.idle_grace_s == 10.0 and m.autoscaling.min_replicas == 0 for m in c.models)
    (pool,) = c.pools
    assert (pool.standby_min, pool.standby_max, pool.max_instances) == (1, 1, 2)
    (shape,) = c.shapes
    assert shape.cache is not None and shape.host_cache_gib == 1.0
    assert c.object_store.kind == "embedded"


def test_the_simulated_config_differs_only_in_boot_s(tmp_path: Path) -> None:
    cfg = lc.stack_config(settings(), data_dir=tmp_path, server_port=1, controller_port=2, s3_port=3)
    sim = lc.simulated_config(cfg, 12.3456)
    assert sim["shapes"][0]["boot_s"] == 12.346
    sim["shapes"][0]["boot_s"] = cfg["shapes"][0]["boot_s"]
    assert sim == cfg


# -- the stack's state --------------------------------------------------------------------------


def state(workers: list[tuple[str, str, str | None]], replicas: dict[str, dict[str, int]] | None = None,
          cached: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    return {
        "models": [{"name": m, "replicas": r} for m, r in (replicas or {}).items()],
        "workers": [{"id": w, "state": s, "model": m} for w, s, m in workers],
        "worker_details": [{"id": w, "shape": lc.SHAPE, "cached": (cached or {}).get(w, [])} for w, _, _ in workers],
    }


@pytest.mark.parametrize(("st", "ok"), [
    (state([("w1", "standby", None)], {"a": {}}), True),
    (state([("w1", "standby", None)], {"a": {"ready": 0}}), True),
    (state([("w1", "ready", "a")], {"a": {"ready": 1}}), False),  # a model serving
    (state([("w1", "standby", None), ("w2", "standby", None)]), False),  # excess not gone yet
    (state([("w1", "draining", "a")], {"a": {"draining": 1}}), False),
    (state([("w1", "starting", None)]), False),
    (state([]), False),
], ids=["floor", "zero-count", "serving", "excess", "draining", "starting", "none"])
def test_settled_is_where_the_simulator_starts(st: dict[str, Any], ok: bool) -> None:
    assert lc.settled(st, standby=1) is ok


def test_booting() -> None:
    assert lc.booting(state([("w1", "standby", None), ("w2", "launching", None)]))
    assert not lc.booting(state([("w1", "ready", "a")]))


def test_transitions_record_changes_and_workers_gone() -> None:
    t1, prev = lc.transitions({}, state([("w1", "standby", None)]), 1.0)
    assert t1 == [lc.Transition(1.0, "w1", "standby", None)]
    t2, prev = lc.transitions(prev, state([("w1", "standby", None)]), 2.0)
    assert t2 == []
    t3, prev = lc.transitions(prev, state([("w2", "launching", None)]), 3.0)
    assert t3 == [lc.Transition(3.0, "w2", "launching", None), lc.Transition(3.0, "w1", "gone")]


def test_a_release_lasts_until_the_worker_stands_by_again() -> None:
    events = [{"kind": "release", "worker_id": "w1", "at": 10.0},
              {"kind": "release", "worker_id": "w2", "at": 20.0},
              {"kind": "release", "worker_id": "w3", "at": 30.0},
              {"kind": "assign", "worker_id": "w1", "at": 5.0}]
    seen = [lc.Transition(4.0, "w1", "standby"),  # before the release: not its end
            # Drained in a second, then a fresh engine host imports vLLM: still releasing.
            lc.Transition(10.25, "w1", "draining", "a"), lc.Transition(11.0, "w1", "starting"),
            lc.Transition(18.5, "w1", "standby"),
            lc.Transition(20.3, "w2", "draining", "b"), lc.Transition(29.0, "w2", "loading", "c"),  # a missed standby
            lc.Transition(31.0, "w3", "gone")]
    assert lc.releases(events, seen) == [Interval(worker_id="w1", start_at=10.0, seconds=8.5),
                                         Interval(worker_id="w2", start_at=20.0, seconds=9.0)]
    # Only those decided in the window.
    assert [r.worker_id for r in lc.releases(events, seen, since=15.0, until=25.0)] == ["w2"]


def test_a_boot_runs_from_the_launch_decision_to_standby() -> None:
    events = [{"kind": "launch", "outcome": "started", "at": 1.0, "worker_id": None},
              {"kind": "launch", "outcome": "started", "at": 2.0, "worker_id": None},
              {"kind": "launched", "outcome": "done", "at": 1.5, "worker_id": "w-a"},
              {"kind": "launched", "outcome": "done", "at": 2.5, "worker_id": "w-b"},
              {"kind": "launch", "outcome": "failed", "at": 3.0, "worker_id": "w-c"}]
    seen = [lc.Transition(1.25, "w-a", "launching"), lc.Transition(2.0, "w-a", "starting"),
            lc.Transition(13.0, "w-a", "standby"),
            lc.Transition(2.25, "w-b", "launching"), lc.Transition(14.0, "w-b", "loading", "m")]
    assert lc.boots(events, seen) == [Interval(worker_id="w-a", start_at=1.0, seconds=12.0),
                                      Interval(worker_id="w-b", start_at=2.0, seconds=12.0)]


# -- the cost model --------------------------------------------------------------------------------


def probe(tier: str, ttft: float | None, served: str | None = None, hot: tuple[float, ...] = (0.1, 0.1)) -> TierProbe:
    return TierProbe(tier=tier, served_tier=served or tier, ttft_s=ttft, hot_ttft_s=list(hot))


def measurements(**kw: Any) -> CostMeasurements:
    base: dict[str, Any] = dict(
        weights_bytes=1 << 29,
        tier_probes=[probe("s3", 5.1), probe("s3", 4.9, hot=(0.3,)), probe("host", 4.1), probe("disk", 4.6),
                     probe("disk", 9.9, served="s3")],  # prepared for disk, served from s3: not counted
        hot=[HotSample(prompt_tokens=100, completion_tokens=10, ttft_s=0.1, tpot_s=0.02),
             HotSample(prompt_tokens=1000, completion_tokens=10, ttft_s=0.3, tpot_s=0.03),
             HotSample(prompt_tokens=500, completion_tokens=1, ttft_s=0.2, tpot_s=None)],
        releases=[Interval(worker_id="w", start_at=0, seconds=s) for s in (7.0, 8.0, 12.0)],
        boots=[Interval(worker_id="w", start_at=0, seconds=s) for s in (11.0, 13.0)])
    return CostMeasurements(**(base | kw))


def test_costs_from_measurements_show_their_arithmetic() -> None:
    r = lc.costs_from_measurements(measurements())
    f = {k: v.value for k, v in r.figures.items()}
    # The hot TTFT of the probe: the median of 0.1, 0.1, 0.3, 0.1, 0.1, 0.1, 0.1 = 0.1.
    assert f["standby_load_s"] == pytest.approx(4.9)  # median(5.1 - 0.1, 4.9 - 0.1)
    assert f["host_load_s"] == pytest.approx(4.0)
    assert f["disk_load_s"] == pytest.approx(4.5)  # the probe served from s3 is left out
    assert r.figures["disk_load_s"].n == 1
    assert f["asleep_load_s"] == f["standby_load_s"] and r.figures["asleep_load_s"].n == 0
    assert f["release_s"] == 8.0
    assert f["prefill_tokens_per_s"] == round(1600 / 0.6, 2)  # (100 + 1000 + 500) / (0.1 + 0.3 + 0.2)
    assert f["tpot_s"] == pytest.approx(0.025)  # median(0.02, 0.03): the one-token answer has none
    assert f["weights_gib"] == 0.5
    assert r.boot_s.value == 12.0 and r.boot_s.n == 2
    assert r.costs_file == {"defaults": f}
    assert all(v.method for v in r.figures.values())


def test_a_tier_not_measured_takes_the_store_figure() -> None:
    r = lc.costs_from_measurements(measurements(tier_probes=[probe("s3", 5.1)], releases=[], boots=[]))
    assert r.figures["host_load_s"].value == r.figures["standby_load_s"].value == 5.0
    assert r.figures["host_load_s"].n == 0 and "not measured" in r.figures["host_load_s"].method
    assert r.figures["release_s"].n == 0 and r.boot_s.n == 0


@pytest.mark.parametrize(("kw", "match"), [
    ({"tier_probes": [probe("host", 4.0)]}, "tier s3"),
    ({"tier_probes": [probe("s3", 4.0, hot=())]}, "hot requests"),
    ({"hot": []}, "prefill"),
    ({"hot": [HotSample(prompt_tokens=9, completion_tokens=1, ttft_s=0.1, tpot_s=None)]}, "TPOT"),
])
def test_the_cost_model_needs_the_store_tier_and_hot_requests(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(lc.CalibrationError, match=match):
        lc.costs_from_measurements(measurements(**kw))


def test_costs_json_is_a_costs_file_the_simulator_takes_whole(tmp_path: Path) -> None:
    r = lc.costs_from_measurements(measurements())
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(r.costs_file))
    cfg = parse_config(lc.stack_config(settings(), data_dir=tmp_path, server_port=1, controller_port=2, s3_port=3))
    # A CPU shape: the planner knows no figure for it, so every one must come from the file.
    model = cost_model(cfg, overrides=read_overrides(path))
    c = model.models["calib-m000"]
    assert c.source == "costs file"
    assert (c.standby_load_s, c.host_load_s, c.disk_load_s) == (4.9, 4.0, 4.5)


# -- the comparison ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("live", "sim", "rel"), [
    (10, 11, 0.1), (10, 9, -0.1), (0, 0, 0.0), (0, 3, None), (None, 1, None), (4.0, None, None),
])
def test_rel_diff(live: float | None, sim: float | None, rel: float | None) -> None:
    assert lc.rel_diff(live, sim) == (pytest.approx(rel) if rel is not None else None)


def rec(index: int, model: str, sent: float, ttft: float | None, tier: str | None, replica: str | None = None,
        ok: bool = True) -> RequestRecord:
    return RequestRecord(index=index, trace_model=model, model=model, input_tokens=10, max_tokens=4,
                         scheduled_s=sent, sent_s=sent, lag_s=0.0, end_s=sent + 1, ttft_s=ttft, tier=tier,
                         replica=replica, finished=ok, status=200 if ok else 503,
                         error_type=None if ok else "InternalServerError", prompt_tokens=20,
                         completion_tokens=4 if ok else 0, inter_token_s=[0.05] * 3 if ok else [])


RECORDS = [
    rec(0, "a", 0.0, 5.0, "s3", "a-1"),
    rec(1, "a", 1.0, 4.0, "s3", "a-1"),  # waited on the same cold start
    rec(2, "a", 8.0, 0.2, "hot", "a-1"),
    rec(3, "b", 9.0, 6.0, "launch", "b-1"),
    rec(4, "a", 30.0, 4.5, "host", "a-2"),  # back from zero
    rec(5, "b", 31.0, None, "cold", None, ok=False),  # timed out: no replica, no cold start counted
]


def test_live_cold_starts_are_one_per_replica_that_served_a_cold_request() -> None:
    colds = lc.live_cold_starts(RECORDS)
    assert [(c.model, c.replica, c.tier, c.opening_ttft_s) for c in colds] == [
        ("a", "a-1", "s3", 5.0), ("b", "b-1", "launch", 6.0), ("a", "a-2", "host", 4.5)]


def test_the_activators_cold_start_counter_per_tier() -> None:
    before = lc.cold_start_counts(
        '# TYPE thaw_cold_starts_total counter\n'
        'thaw_cold_starts_total{model="a",tier="s3"} 4.0\nthaw_cold_starts_total{model="b",tier="s3"} 1.0\n'
        'thaw_cold_starts_total{model="a",tier="host"} 2.0\n'
        '# TYPE thaw_requests_total counter\nthaw_requests_total{model="a",status="200"} 9.0\n')
    assert before == {"s3": 5, "host": 2}
    after = {"s3": 7, "host": 2, "disk": 1}
    assert lc.counts_since(before, after) == {"disk": 1, "s3": 2}


def test_replica_seconds_integrate_the_polled_steps() -> None:
    samples = [ReplicaSample(t_s=t, model="a", replicas=r) for t, r in
               [(0.0, {}), (1.0, {"loading": 1}), (3.0, {"ready": 1}), (10.0, {"draining": 1}), (12.0, {})]]
    steps = lc.steps_from_samples(samples)
    assert steps == {"a": [(0.0, 0), (1.0, 1), (3.0, 1), (10.0, 0), (12.0, 0)]}
    assert lc.integrate(steps["a"], 20.0) == 9.0  # loading 1..3 + ready 3..10
    assert lc.integrate(steps["a"], 5.0) == 4.0  # cut at the end
    assert lc.integrate([], 5.0) == 0.0


def test_simulated_replicas_from_decisions() -> None:
    decisions: list[tuple[float, Decision]] = [(0.0, Assign("w1", "a", "x1")), (0.0, Launch("cpu", "standby")), (2.0, Assign("w2", "b", "x2")),
                 (10.0, Release("w1", "a", "idle")), (11.0, Release("w9", None, "failed")),
                 (12.0, Assign("w1", "b", "x3")), (20.0, Terminate("w2", "excess_standby"))]
    assert lc.sim_steps(decisions) == {"a": [(0.0, 1), (10.0, 0)], "b": [(0.0, 0), (2.0, 1), (12.0, 2), (20.0, 1)]}


def outcome(**kw: Any) -> lc.SimOutcome:
    base: dict[str, Any] = dict(ttft_s={0: 4.0, 1: 3.0, 2: 0.1, 3: 7.0, 4: 4.4, 5: 0.1}, cold=frozenset({0, 1, 3, 4}),
                                requests=6, activation_timeouts=0, queue_full=0,
                                cold_starts_by_tier={"s3": 1, "launch": 1, "host": 1},
                                replica_seconds={"a": 20.0, "b": 12.0},
                                openings=[("s3", 4.0), ("launch", 7.0), ("host", 4.4)])
    return lc.SimOutcome(**(base | kw))


def test_compare_side_by_side() -> None:
    samples = [ReplicaSample(t_s=0.0, model="a", replicas={"ready": 1}), ReplicaSample(t_s=0.0, model="b",
                                                                                       replicas={"loading": 1})]
    rows = {r.metric: r for r in lc.compare(RECORDS, samples, 10.0, outcome(), ["a", "b"])}
    assert (rows["requests"].live, rows["requests"].sim) == (6, 6)
    assert (rows["errors"].live, rows["errors"].sim) == (1, 0)
    assert (rows["cold_starts"].live, rows["cold_starts"].sim) == (3, 3)
    assert rows["cold_starts"].rel_diff == 0.0
    assert (rows["cold_starts.launch"].live, rows["cold_starts.disk"].live) == (1, 0)
    assert (rows["replica_seconds.a"].live, rows["replica_seconds.b"].live) == (10.0, 10.0)
    assert rows["replica_seconds"].rel_diff == pytest.approx((32 - 20) / 20)
    # Live TTFTs of the five answered: 0.2, 4.0, 4.5, 5.0, 6.0; nearest rank p50 is the 3rd.
    assert rows["ttft_s.p50"].live == 4.5 and rows["ttft_s.p90"].live == 6.0
    # Simulated: 0.1, 0.1, 3.0, 4.0, 4.4, 7.0: p50 is the 3rd, p90 the 6th.
    assert rows["ttft_s.p50"].sim == 3.0 and rows["ttft_s.p90"].sim == 7.0
    assert (rows["ttft_s.hot.p50"].live, rows["ttft_s.hot.p50"].sim) == (0.2, 0.1)
    assert rows["ttft_s.cold.p99"].live == 6.0


def test_diagnostics_per_tier_and_the_pool() -> None:
    r = lc.costs_from_measurements(measurements())
    rows = {d.metric: d for d in lc.diagnostics(RECORDS, outcome(), [Interval(worker_id="w", start_at=0, seconds=9)],
                                                [], r)}
    assert (rows["cold_start_ttft_s.p50"].live, rows["cold_start_ttft_s.p50"].sim) == (5.0, 4.4)
    assert (rows["cold_start_ttft_s.p50.launch"].live, rows["cold_start_ttft_s.p50.launch"].sim) == (6.0, 7.0)
    assert "cold_start_ttft_s.p50.disk" not in rows
    assert (rows["release_s.median"].live, rows["release_s.median"].sim) == (9, 8.0)
    assert rows["boot_s.median"].live is None
    # TPOT: every answer's 4 tokens came 0.05 s apart; the cost model's 0.025 s.
    assert (rows["tpot_s.p50"].live, rows["tpot_s.p50"].sim) == (pytest.approx(0.05), pytest.approx(0.025))
    # The one hot answer: 0.2 s for 20 prompt tokens = 10 s per 1,000; the model's 1000 / rate.
    assert rows["hot_ttft_s_per_1k_prompt_tokens.p50"].live == pytest.approx(10.0)
    assert rows["hot_ttft_s_per_1k_prompt_tokens.p50"].sim == pytest.approx(1000 / r.figures["prefill_tokens_per_s"].value)


def test_serving_share_is_the_trace_at_the_measured_speeds() -> None:
    r = lc.costs_from_measurements(measurements())  # prefill 2666.67 tokens/s, TPOT 0.025 s
    tr = from_columns([0.0, 50.0, 100.0], [0] * 3, [0] * 3, [2000, 1000, 0], [40, 0, 40], ["m"], ["t"], "")
    # (2000 + 1000) / 2666.67 + (40 + 40) x 0.025 = 1.125 + 2.0 = 3.125 s busy over 100 s.
    assert lc.serving_share(tr, r) == pytest.approx(3.125 / 100, rel=1e-5)


def test_the_verdict_says_which_goal_is_not_met() -> None:
    rows = [lc.row("cold_starts", 20, 22), lc.row("ttft_s.p90", 10.0, 13.0)]
    v = lc.verdict(rows)
    # 22 vs 20 is +10 %: met (at the edge); 13 vs 10 is +30 %: not.
    assert [g.met for g in v.goals] == [True, False]
    assert v.not_met == ["ttft_s.p90"] and not v.met
    assert "NOT met" in v.text and "ttft_s.p90" in v.text.split("Goal NOT met")[1]
    assert lc.verdict([lc.row("cold_starts", 20, 19), lc.row("ttft_s.p90", 10.0, 8.0)]).met


def test_a_goal_without_a_live_figure_is_not_measurable() -> None:
    v = lc.verdict([lc.row("cold_starts", 0, 3)])
    assert [g.met for g in v.goals] == [None, None] and v.not_met == ["cold_starts", "ttft_s.p90"]
    assert "not measurable" in v.text


# -- the simulation ---------------------------------------------------------------------------------


def test_the_simulation_records_each_request_as_the_summary_counts_it(tmp_path: Path) -> None:
    # Model a: a request at 0 and 1 (one cold start), one at 100 s (idle_grace 10: back
    # from zero); model b: one at 50 s, while a is at zero.
    trace = from_columns([0.0, 1.0, 50.0, 100.0], [0, 0, 1, 0], [0] * 4, [100] * 4, [10] * 4,
                         lc.model_names(2), ["t"], "test")
    write_generic(trace, tmp_path / "trace.csv")
    r = lc.costs_from_measurements(measurements())
    (tmp_path / "costs.json").write_text(json.dumps(r.costs_file))
    cfg = lc.stack_config(settings(models=lc.model_names(2)), data_dir=tmp_path, server_port=1, controller_port=2,
                          s3_port=3)
    sim, _ = lc.run_simulation(lc.simulated_config(cfg, 12.0), tmp_path / "trace.csv", tmp_path / "costs.json", 0.25,
                               tmp_path / "sim")
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["cold_starts"] == sum(sim.cold_starts_by_tier.values()) == 3
    assert sorted(sim.ttft_s) == [0, 1, 2, 3] and sim.cold == {0, 1, 2, 3}
    assert sim.ttft_s[0] == pytest.approx(4.9 + 100 / r.figures["prefill_tokens_per_s"].value, abs=0.3)
    assert summary["ttft_s"]["p90"] == pytest.approx(sorted(sim.ttft_s.values())[3])
    assert len(sim.openings) == 3 and all(v is not None for _, v in sim.openings)
    # The first cold start took the one standby and came from the store.
    assert sim.openings[0][0] == "s3"
    # Model a: up at 0, down after its idle grace, up again at 100 s until the end.
    assert [n for _, n in sim.steps["calib-m000"]] == [1, 0, 1]
    rs = sum(summary["per_model"][m]["replica_seconds"] for m in summary["per_model"])
    assert sum(sim.replica_seconds.values()) == pytest.approx(rs)


# -- the cost phase, against a fake stack ----------------------------------------------------------------


class FakeWorld:
    """One model, one standby worker with a host and a disk cache. A request to the model
    at zero loads it from the fastest tier holding it (and fills both); every state poll
    with no request since the last brings the model one poll nearer to zero (3 polls)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.held: set[str] = set()
        self.serving = False
        self.idle_polls = 0
        self.last_cold: dict[str, Any] | None = None
        self.cleared: list[str] = []
        self.n = 0

    # Stack's side.
    def check_alive(self) -> None:
        pass

    def state(self) -> dict[str, Any]:
        if self.serving:
            self.idle_polls += 1
            if self.idle_polls > 3:
                self.serving = False
        cached = [{"uri": self.uri, "tier": t, "bytes": 10, "total_bytes": 10} for t in sorted(self.held)]
        st = state([("w1", "ready", "m") if self.serving else ("w1", "standby", None)],
                   {"m": {"ready": 1} if self.serving else {}}, {"w1": cached})
        st["models"][0]["last_cold_start"] = self.last_cold
        return st

    def clear_tier(self, worker_id: str, tier: str) -> None:
        assert not self.serving and worker_id == "w1"
        self.held.discard(tier)
        self.cleared.append(tier)

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        return []

    # The client's side.
    def request(self, model: str, index: int, input_tokens: int, max_tokens: int, **_: Any) -> RequestRecord:
        self.n += 1
        self.idle_polls = 0
        r = rec(index, model, 0.0, 0.0, "hot", "m-1")
        r.request_id, r.prompt_tokens, r.completion_tokens = f"r{self.n}", input_tokens, max_tokens
        r.inter_token_s = [0.01] * (max_tokens - 1)
        if self.serving:
            r.ttft_s = 0.1
            return r
        tier = "host" if "host" in self.held else "disk" if "disk" in self.held else "s3"
        r.tier, r.ttft_s = tier, {"host": 3.0, "disk": 3.5, "s3": 4.0}[tier]
        self.held |= {"host", "disk"}
        self.serving = True
        self.last_cold = {"request_id": r.request_id, "load_s": 0.5, "phases_s": {"weights_loaded": 1.0}}
        return r


class FakeWatch:
    def transitions(self) -> list[lc.Transition]:
        return []


def test_the_cost_phase_prepares_each_tier_and_measures_it(monkeypatch: pytest.MonkeyPatch) -> None:
    world = FakeWorld("s3://thaw/calibrate/m")
    monkeypatch.setattr(lc, "one_request", lambda stack, model, index, inp, out, **kw: world.request(
        model, index, inp, out))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    phase = lc.CostPhase(world, FakeWatch(), "m", world.uri, seed=0, timeout_s=30, standby=1)  # type: ignore[arg-type]
    m = phase.run([(100, 4), (1000, 8)], reps=2, weights_bytes=1 << 20)
    assert [(p.tier, p.served_tier) for p in m.tier_probes] == [(t, t) for t in lc.PROBE_TIERS] * 2
    # s3 empties both caches; host finds the model held; disk drops the host copy only.
    assert world.cleared == ["host", "disk", "host"] * 2
    assert all(p.hot_ttft_s == [0.1] * lc.HOT_PROBES_PER_COLD for p in m.tier_probes)
    assert m.tier_probes[0].load_s == 0.5 and m.tier_probes[0].phases_s == {"weights_loaded": 1.0}
    assert [(h.prompt_tokens, h.completion_tokens) for h in m.hot] == [(100, 4), (1000, 8)]
    costs = lc.costs_from_measurements(m)
    assert [costs.figures[k].value for k in ("standby_load_s", "disk_load_s", "host_load_s")] == [3.9, 3.4, 2.9]


# -- the command -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--models", "0"], ["--speedup", "0"], ["--max-input-tokens", "2040"],
                                  ["--trace-source", "/nonexistent.csv"]])
def test_bad_options_exit_2(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert thaw(["load", "calibrate", "--out-dir", str(tmp_path / "out"), *argv]) == 2
    assert "thaw load calibrate:" in capsys.readouterr().err
