"""The simulator: hand-computed runs, the keep-alive identity, and its fast mode against
the controller's cadence (every model judged on every tick)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator.costs import CostModel, ModelCosts, cost_model, read_overrides
from simulator.run import SimError, prepare, with_trace_models
from simulator.sim import SUMMARY_KEYS, Simulator, engine_classes
from tests.simulator.support import cli_args, config, costs, equivalence_cfg, trace
from thaw.config import ThawConfig
from warm_pool.policy.decide import decide
from warm_pool.policy.decisions import Assign, Pack, Prebuild, Release, UnloadAdapter


def test_a_hand_computed_run() -> None:
    cfg = config()
    tr = trace([(0.0, "m0", 100, 100), (50.0, "m0", 100, 100), (300.0, "m0", 100, 100)])
    r = Simulator(cfg, costs(cfg), tr, record_decisions=True).run()
    s = r.summary
    assert tuple(s) == SUMMARY_KEYS
    # t=0: a request at zero takes the one standby (A) at once and the pool launches a
    # replacement (B, 60 s boot). A loads for 10 s: TTFT 10 + 100 tokens / 1000 tok/s
    # = 10.1 s; done at 10.1 + 100 x 0.01 = 11.1 s.
    # t=50: hot, TTFT 0.1 s, done at 51.1 s: idle from 51.1.
    # The keep-alive (100 s) ends at 151.1: released at the next tick, 152 (release 0 s).
    # t=300: a cold start again, on A (the standby with the lower id): TTFT 10.1 s.
    assert s["requests"] == 3 and s["cold_starts"] == 2
    assert s["cold_start_share"] == pytest.approx(2 / 3)
    assert s["ttft_s"] == {"p50": pytest.approx(10.1), "p90": pytest.approx(10.1), "p99": pytest.approx(10.1)}
    assert s["activation_timeouts"] == 0 and s["asleep_seconds"] == 0
    # Serving: A from 0 to 152, and from 300 until the last answer at 311.1 = 163.1 s.
    assert s["replica_seconds"] == pytest.approx(152 + 11.1)
    kinds = [(t, type(d).__name__, getattr(d, "reason", None)) for t, d in r.decisions]
    assert kinds[:2] == [(0.0, "Assign", "demand"), (0.0, "Launch", "standby")]
    assert (152.0, "Release", "idle") in kinds
    # Standby: B boots 0-60 and stands by until the tick after A returns (153), when
    # one of two is in excess and the newest (B) goes: 153 s. A stands by 152-300:
    # 148 s. The pool replaces A at 300: C boots until the end, 11.1 s.
    assert (153.0, "Terminate", "excess_standby") in kinds
    assert s["standby_seconds"] == pytest.approx(153 + 148 + 11.1)
    # $3.60/h is $0.001/s, for every instance-second.
    assert s["usd"] == pytest.approx((163.1 + 153 + 148 + 11.1) * 0.001)
    # SLO 5 s: the hot request met it, the two cold ones did not.
    assert s["slo_met_share"] == pytest.approx(1 / 3)
    per = s["per_model"]["m0"]
    assert per["cold_starts_by_tier"] == {"s3": 2}
    assert per["cold_start_s"]["p50"] == pytest.approx(10.0)


def test_requests_that_wait_past_their_activation_timeout_are_refused() -> None:
    # No standby and a 200 s boot: the requests at 0 and 20 wait 30 s each for the
    # instance launched for them, and are refused (503) at 30 and 50. One cold start.
    cfg = config(standby_min=0, standby_max=0, boot_s=200, activation_timeout_s=30)
    tr = trace([(0.0, "m0", 10, 10), (20.0, "m0", 10, 10)])
    r = Simulator(cfg, costs(cfg), tr, record_decisions=True).run()
    s = r.summary
    assert s["activation_timeouts"] == 2 and s["cold_starts"] == 1 and s["cold_start_share"] == 1.0
    assert s["ttft_s"]["p50"] is None and s["slo_met_share"] == 0.0
    assert [(t, type(d).__name__, d.reason) for t, d in r.decisions[:1]] == [(0.0, "Launch", "demand")]
    assert s["per_model"]["m0"]["cold_starts_by_tier"] == {}


def test_a_full_queue_refuses_requests_beyond_it() -> None:
    cfg = config(max_queue_length=2, max_concurrency_per_replica=1)
    tr = trace([(0.0, "m0", 10, 10)] * 5)
    s = Simulator(cfg, costs(cfg), tr).run().summary
    assert s["per_model"]["m0"]["queue_full"] == 3


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([5, 30]), seed_gaps=st.lists(st.lists(st.integers(1, 90), min_size=1, max_size=12),
                                                        min_size=1, max_size=3))
@example(k=5, seed_gaps=[[49], [44, 5]])  # m0's demand at 49 must not release m1 before m1's request at 49
def test_fixed_keep_alive_cold_starts_are_the_gaps_longer_than_k(k: int, seed_gaps: list[list[int]]) -> None:
    # One replica per model, nothing takes time (load, prefill, decode, release all 0)
    # and a standby is always there: a request is cold exactly when its model's
    # previous request ended more than K seconds before (plus each model's first).
    # Integer times and a 1 s tick: the release is at the tick K after the last request.
    n = len(seed_gaps)
    cfg = config(n, idle_grace_s=k, standby_min=n, standby_max=n, max_instances=2 * n, boot_s=1)
    rows, expected = [], 0
    for i, gaps in enumerate(seed_gaps):
        t = 0
        for j, g in enumerate(gaps):
            t += g
            rows.append((float(t), f"m{i}", 1, 1))
            if j == 0 or g > k:
                expected += 1
    s = Simulator(cfg, costs(cfg, load_s=0, prefill=math.inf, tpot_s=0), trace(rows)).run().summary
    assert s["cold_starts"] == expected


def test_a_scheduled_window_has_a_replica_up_before_its_first_request() -> None:
    # m0 is used at 00:00:10 and 01:05 (the simulator's t = 0 is 1970-01-01 00:00 UTC);
    # idle grace 100 s. Without a schedule the 01:05 request is a cold start; with a
    # window from 01:00 for 10 minutes a replica is up by then and it is hot.
    rows = [(10.0, "m0", 100, 100), (3900.0, "m0", 100, 100)]
    plain = config()
    data = plain.model_dump()
    data["models"][0]["prewarm"] = [{"cron": "0 1 * * *", "for_s": 600}]
    scheduled = ThawConfig.model_validate(data)
    runs = {}
    for name, cfg in (("plain", plain), ("scheduled", scheduled)):
        runs[name] = Simulator(cfg, costs(cfg), trace(rows), record_decisions=True).run()
    assert [c.at for c in runs["plain"].cold_starts] == [10.0, 3900.0]
    assert [c.at for c in runs["scheduled"].cold_starts] == [10.0]
    assigns = [(t, d.reason) for t, d in runs["scheduled"].decisions if isinstance(d, Assign)]
    assert (3600.0, "prewarm") in assigns
    # Held, idle, from 01:00 until the request (the idle grace alone would have let it go).
    assert not [t for t, d in runs["scheduled"].decisions
                if isinstance(d, Release) and d.model == "m0" and 3600.0 <= t <= 3900.0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.integers(0, 11),
       arrivals=st.lists(st.tuples(st.floats(0, 400, allow_nan=False), st.integers(0, 3), st.integers(1, 4000),
                                   st.integers(1, 400)), min_size=1, max_size=60))
def test_the_fast_mode_makes_the_controllers_decisions(variant: int, arrivals: list[tuple[float, int, int, int]]) -> None:
    """Judging only the models whose decision can change gives the decisions (and so
    every figure) of judging every model on every tick, as the controller does."""
    cfg = equivalence_cfg(variant)
    tr = trace([(round(t, 3), f"m{m}", i, o) for t, m, i, o in arrivals])
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    fast = Simulator(cfg, c, tr, record_decisions=True).run()
    exact = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
    assert fast.decisions == exact.decisions
    assert fast.summary == exact.summary
    assert fast.judged <= exact.judged


def test_the_fast_mode_makes_the_controllers_decisions_by_the_time_of_day() -> None:
    # Slots of about 2 minutes over 10 minutes of bursts and lulls: the windows differ by
    # the slot an idle period began in, and the fast mode still judges as the controller.
    cfg = equivalence_cfg(11)
    tr = trace([((t * 53) % 600 + (t % 5) * 0.5, f"m{t % 3}", 400, 60) for t in range(120)])
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    fast = Simulator(cfg, c, tr, record_decisions=True).run()
    exact = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
    assert fast.decisions == exact.decisions and fast.decisions
    assert fast.summary == exact.summary


# The asleep tier; with pre-built engines too, on a sparser trace (idle standbys build
# engines between cold starts, which swap into them); packed engines; LoRA adapters.
@pytest.mark.parametrize(("variant", "step_s", "span_s"), [(1, 7.0, 500), (5, 37.0, 3000), (7, 13.0, 900),
                                                          (8, 13.0, 900), (10, 11.0, 600), (11, 11.0, 600)])
def test_each_decision_is_what_decide_returns_for_the_same_inputs(variant: int, step_s: float, span_s: int) -> None:
    # Record what the simulator hands decide() and replay it: the simulator neither
    # adds, drops nor alters a decision.
    cfg = equivalence_cfg(variant)
    tr = trace([(t * step_s % span_s, f"m{t % 4}", 500, 100) for t in range(80)])
    calls: list[tuple[Any, ...]] = []

    import simulator.controller as controller_module

    real = controller_module.decide

    def recording(snap, state, c, now, **kw):  # type: ignore[no-untyped-def]
        out = real(snap, state, c, now, **kw)
        calls.append((snap, state, now, kw, out))
        return out

    controller_module.decide = recording  # type: ignore[assignment]
    try:
        r = Simulator(cfg, costs(cfg), tr, record_decisions=True).run()
    finally:
        controller_module.decide = real  # type: ignore[assignment]
    replayed = []
    for snap, state, now, kw, out in calls:
        again = decide(snap, state, cfg, now, **kw)
        assert again == out
        replayed.extend((now, d) for d in again[0])
    assert replayed == r.decisions and r.decisions
    if variant == 5:
        assert any(isinstance(d, Prebuild) for _, d in r.decisions) and r.summary["cold_starts_by_tier"]["swap"]
    if variant == 7:
        assert any(isinstance(d, Pack) for _, d in r.decisions) and r.summary["cold_starts_by_tier"]["packed"]
    if variant == 8:
        assert any(isinstance(d, UnloadAdapter) for _, d in r.decisions) and r.summary["cold_starts_by_tier"]["adapter"]


def test_on_admit_hears_each_admitted_requests_ttft() -> None:
    # Two requests at once on a one-slot replica: the second waits for the first's answer.
    cfg = config(1, max_concurrency_per_replica=1)
    tr = trace([(0.0, "m0", 1000, 100), (0.0, "m0", 1000, 100), (50.0, "m0", 1000, 100)])
    heard: dict[int, float] = {}
    s = Simulator(cfg, costs(cfg), tr, on_admit=heard.__setitem__).run().summary
    assert sorted(heard) == [0, 1, 2]
    assert s["ttft_s"]["p99"] == max(heard.values()) and heard[1] > heard[0]


def test_same_inputs_same_output() -> None:
    cfg = equivalence_cfg(2)
    tr = trace([((t * 37) % 1000 + 0.25, f"m{t % 3}", 100 + t, 50) for t in range(150)])
    a = Simulator(cfg, costs(cfg), tr).run().summary
    b = Simulator(cfg, costs(cfg), tr).run().summary
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_trace_models_take_the_templates_settings() -> None:
    cfg = config(1, idle_grace_s=77)
    tr = trace([(0.0, "other-model", 1, 1), (1.0, "m0", 1, 1)])
    full = with_trace_models(cfg, tr, "m0")
    added = full.model("other-model")
    assert added is not None and added.autoscaling.idle_grace_s == 77 and added.shape == "gpu"
    with pytest.raises(SimError, match="--model-template"):
        with_trace_models(cfg, tr, None)
    with pytest.raises(SimError, match="not a configured model"):
        with_trace_models(cfg, tr, "nope")


def test_default_costs_come_from_the_planner() -> None:
    cfg = config()
    c = cost_model(cfg).models["m0"]
    # Llama 3.1 8B in bf16: 8.03e9 x 2 B = 16.06 GB; streamed at 2 GB/s + 5 s engine start.
    assert c.weights_gib == pytest.approx(16.06e9 / 2**30, rel=0.01)
    assert c.standby_load_s == pytest.approx(16.06 / 2 + 5, rel=0.01)
    assert c.prefill_tokens_per_s > 1000 and 0 < c.tpot_s < 1


def test_the_cli_writes_the_summary(tmp_path: Path) -> None:
    from thaw.cli.main import main

    cfg_file = tmp_path / "thaw.yaml"
    cfg_file.write_text(json.dumps(json.loads(config().model_dump_json(exclude={"data_dir"}))))
    tr_file = tmp_path / "trace.csv"
    tr_file.write_text("timestamp,model,tenant,input_tokens,output_tokens\n0,m0,t,10,10\n5,m9,t,10,10\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(tr_file), "--config", str(cfg_file), "--model-template", "m0",
                 "--out-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert tuple(summary) == SUMMARY_KEYS and summary["requests"] == 2
    assert set(summary["per_model"]) == {"m0", "m9"}
    assert json.loads((out / "run.json").read_text())["trace"]["requests"] == 2
    # Without a template, the trace's unknown model is an error naming the fix.
    assert main(["simulate", "--trace", str(tr_file), "--config", str(cfg_file), "--out-dir", str(out)]) == 2
    assert not math.isnan(summary["usd"])


def test_a_run_starts_from_the_keep_alive_histograms_an_earlier_one_wrote(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    # m0: a request every 500 s, each busy 3 s (100 tokens at 100/s, 4 at 0.5 s): nine
    # idle intervals of 497 s. Learned keep-alive at a price of 100 s.
    rows = [(float(t), "m0", 100, 4) for t in range(0, 5000, 500)]
    args = cli_args(tmp_path, config(1, idle_grace_s=100, keep_alive="histogram"), rows, prefill=100, tpot_s=0.5)
    day1, day2 = tmp_path / "day1.json", tmp_path / "day2.json"
    assert main([*args, "--out-dir", str(tmp_path / "a"), "--keepalive-to", str(day1)]) == 0
    saved = json.loads(day1.read_text())
    assert saved["m0"]["bin_s"] == 60.0 and saved["m0"]["histogram"]["counts"][8] == 9
    first = json.loads((tmp_path / "a" / "summary.json").read_text())["cold_starts"]
    # The second day starts from the first's nine intervals (and adds nine), so its
    # first idle period already lets go and pre-warms at 420 s: fewer cold starts.
    assert main([*args, "--out-dir", str(tmp_path / "b"), "--keepalive-from", str(day1),
                 "--keepalive-to", str(day2)]) == 0
    assert json.loads(day2.read_text())["m0"]["histogram"]["counts"][8] == 18
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["cold_starts"] < first
    # Counted with other bins: not used, and said; an unreadable file: refused.
    saved["m0"]["bin_s"] = 30.0
    day1.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main([*args, "--out-dir", str(tmp_path / "c"), "--keepalive-from", str(day1)]) == 0
    assert "m0's histogram is not used: counted with other bins than bin_s 60" in capsys.readouterr().err
    day1.write_text("[1, 2]")
    assert main([*args, "--keepalive-from", str(day1)]) == 2
    assert "not an object of models' histograms" in capsys.readouterr().err
    assert main([*args, "--keepalive-from", str(tmp_path / "missing.json")]) == 2
    assert main([*args, "--sweep", "--keepalive-to", str(day2)]) == 2
    assert "--keepalive-to goes with a single run" in capsys.readouterr().err
    assert main([*args, "--oracle", "--keepalive-from", str(day2)]) == 2
    assert "the oracle has no policy to start" in capsys.readouterr().err
    # A fleet whose models keep a fixed timeout learns nothing, and is told so.
    fixed = cli_args(tmp_path, config(1, idle_grace_s=100), rows, prefill=100, tpot_s=0.5)
    assert main([*fixed, "--out-dir", str(tmp_path / "d"), "--keepalive-to", str(day2)]) == 0
    assert json.loads(day2.read_text()) == {} and "only models with keep_alive: histogram" in capsys.readouterr().err


def test_the_wait_for_a_models_first_request_is_learnt_from_the_traces_start(tmp_path: Path) -> None:
    from thaw.cli.main import main

    # m0 is called at 0 (no wait to learn), m1 first at 3,000 s: as a controller started
    # with the trace would, the simulator counts m1's 3,000 s as its first interval.
    rows = [(0.0, "m0", 100, 4), (3000.0, "m1", 100, 4)]
    args = cli_args(tmp_path, config(2, idle_grace_s=100, keep_alive="histogram"), rows, prefill=100, tpot_s=0.5)
    out = tmp_path / "h.json"
    assert main([*args, "--out-dir", str(tmp_path / "a"), "--keepalive-to", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert "m0" not in saved and saved["m1"]["histogram"]["counts"] == [0] * 50 + [1]


def test_prepare_refuses_a_shape_the_planner_does_not_know() -> None:
    cfg = ThawConfig.model_validate({
        "shapes": [{"name": "cpu", "gpu_type": "cpu", "gpu_count": 0, "host_memory_gib": 8,
                    "price_per_hour_usd": 0}],
        "models": [{"name": "m0", "uri": "s3://thaw/m0", "shape": "cpu"}],
    })
    from simulator.costs import CostError

    with pytest.raises(CostError, match="costs file"):
        prepare(cfg, trace([(0.0, "m0", 1, 1)]))


def test_workers_keep_the_models_they_loaded_and_placement_finds_them() -> None:
    """Cold starts of one model, far apart: the first reads the store, the next ones a
    standby's host copy (at the host load time); a host tier too small falls to disk."""
    def run(host_gib: float) -> list[tuple[str, float]]:
        data = config(idle_grace_s=10, standby_max=1).model_dump()
        data["shapes"][0].update({"host_cache_gib": host_gib, "cache": {"dir": "c", "max_gib": 10}})
        cfg = ThawConfig.model_validate(data)
        cm = CostModel({"m0": ModelCosts(weights_gib=1.0, standby_load_s=20.0, host_load_s=2.0, disk_load_s=5.0,
                                         asleep_load_s=1.0, release_s=0.0, prefill_tokens_per_s=1e6, tpot_s=0.01,
                                         source="test")})
        r = Simulator(cfg, cm, trace([(0.0, "m0", 10, 4), (500.0, "m0", 10, 4), (1000.0, "m0", 10, 4)])).run()
        return [(c.tier, round(c.ready_after_s, 1)) for c in r.cold_starts]

    assert run(host_gib=2) == [("s3", 20.0), ("host", 2.0), ("host", 2.0)]
    assert run(host_gib=0.5) == [("s3", 20.0), ("disk", 5.0), ("disk", 5.0)]


# -- pre-built engines (pools[].prebuild): the swap tier --------------------------------------


def prebuild_config(prebuild: list[str], *, m1_context: int = 2048) -> ThawConfig:
    """Two models on one standby (1..1, boot 60 s); m1 of m0's engine class unless its
    context differs."""
    data = config(2, idle_grace_s=100).model_dump()
    data["pools"][0]["prebuild"] = prebuild
    data["models"][1]["max_context_tokens"] = m1_context
    return ThawConfig.model_validate(data)


def prebuild_costs(cfg: ThawConfig) -> CostModel:
    # From the store 10 s, of which 5 s start the engine: a swap reads the weights (5 s)
    # and adds 0.3 s. 100 prompt tokens at 1000/s: 0.1 s to the first token.
    return CostModel({m.name: ModelCosts(weights_gib=1.0, standby_load_s=10.0, asleep_load_s=1.0, release_s=2.0,
                                         prefill_tokens_per_s=1000.0, tpot_s=0.01, engine_start_s=5.0, swap_s=0.3,
                                         source="test") for m in cfg.models})


# m1 at 100 s, m0 at 400 s, each a cold start (keep-alive 100 s, release 2 s in between).
APART = [(100.0, "m1", 100, 100), (400.0, "m0", 100, 100)]


@pytest.mark.parametrize(("case", "prebuild", "m1_context", "arrivals", "tiers", "ttfts"), [
    # The standby reads each model from the store and starts an engine: 10 + 0.1 s.
    ("no prebuild", [], 2048, APART, ["s3", "s3"], [10.1, 10.1]),
    # t=0: the standby builds m0's engine (a full start of m0, built at 10 s). At 100 m1
    # swaps into it: 10 - 5 + 0.3 = 5.3 s, TTFT 5.4. Released at 207, the replica goes
    # back to standby keeping the engine; m0 at 400 swaps too: 5.4.
    ("prebuild, one class", ["m0"], 2048, APART, ["swap", "swap"], [5.4, 5.4]),
    # m1 of another class: the standby stops m0's engine (m0's release_s, 2 s), then
    # starts m1 in full: 2 + 10 = 12 s, TTFT 12.1. Released at 214, it stands by at 216
    # keeping m1's engine; the standby launched at 100 built m0's by 170. Of the two, the
    # excess one is the engine of a class the pool does not pre-build (m1's): m0 at 400
    # swaps into its own class's engine, 10 - 5 + 0.3 + 0.1 = 5.4.
    ("prebuild, another class", ["m0"], 4096, APART, ["s3", "swap"], [12.1, 5.4]),
    # At 4 s the engine is still building (until 10 s): the swap waits 6 s, then 5.3 s:
    # TTFT 6 + 5.3 + 0.1 = 11.4 (no prebuild: 10.1).
    ("a swap waits for the build", ["m0"], 2048, [(4.0, "m1", 100, 100)], ["swap"], [11.4]),
])
def test_cold_starts_swap_into_prebuilt_engines(case: str, prebuild: list[str], m1_context: int,
                                                arrivals: list[tuple[float, str, int, int]], tiers: list[str],
                                                ttfts: list[float]) -> None:
    cfg = prebuild_config(prebuild, m1_context=m1_context)
    r = Simulator(cfg, prebuild_costs(cfg), trace(arrivals), record_decisions=True).run()
    assert [c.tier for c in r.cold_starts] == tiers, case
    assert sorted(r.summary["per_model"][m]["ttft_s"]["p50"] for m in ("m0", "m1")
                  if m in r.summary["per_model"]) == pytest.approx(sorted(ttfts)), case
    assert r.summary["cold_starts_by_tier"] == {t: tiers.count(t) for t in tiers}, case
    assert any(isinstance(d, Prebuild) for _, d in r.decisions) == bool(prebuild), case


def test_prebuild_lowers_the_ttft_of_the_same_trace() -> None:
    def run(prebuild: list[str]) -> dict[str, Any]:
        cfg = prebuild_config(prebuild)
        return Simulator(cfg, prebuild_costs(cfg), trace(APART)).run().summary

    without, with_ = run([]), run(["m0"])
    assert without["cold_starts"] == with_["cold_starts"] == 2
    assert without["cold_starts_by_tier"] == {"s3": 2} and with_["cold_starts_by_tier"] == {"swap": 2}
    # 10.1 s from the store against 5.4 s by a swap.
    assert with_["ttft_s"]["p99"] == pytest.approx(5.4) and without["ttft_s"]["p99"] == pytest.approx(10.1)
    assert with_["per_model"]["m1"]["cold_start_s"]["p50"] == pytest.approx(5.3)


def test_engine_classes_are_assumed_from_size_engine_and_context() -> None:
    # No pool pre-builds: the controller reads no classes, nothing is swapped or kept.
    assert engine_classes(prebuild_config([]), prebuild_costs(prebuild_config([]))) == {}
    cfg = prebuild_config(["m0"])
    classes = engine_classes(cfg, prebuild_costs(cfg))
    assert set(classes) == {"m0", "m1"} and classes["m0"] == classes["m1"]
    other = prebuild_config(["m0"], m1_context=4096)
    assert len(set(engine_classes(other, prebuild_costs(other)).values())) == 2
    # Another size (a costs file's weights_gib) is another architecture: another class.
    c = prebuild_costs(cfg)
    bigger = CostModel({**c.models, "m1": replace(c.models["m1"], weights_gib=2.0)})
    assert len(set(engine_classes(cfg, bigger).values())) == 2


def test_a_swap_costs_the_weights_and_swap_s(tmp_path: Path) -> None:
    c = ModelCosts(weights_gib=1.0, standby_load_s=10.0, host_load_s=6.0, asleep_load_s=1.0, release_s=2.0,
                   prefill_tokens_per_s=1000.0, tpot_s=0.01, source="test")
    # Defaults: a 5 s engine start and 0.3 s for the swap. s3: 10 - 5 + 0.3; host: 6 - 5 + 0.3.
    assert c.swap_load_s("s3") == pytest.approx(5.3) and c.swap_load_s("host") == pytest.approx(1.3)
    # The planner's 8B: 16.06 GB / 2 GB/s from the store, + 0.3.
    assert cost_model(config()).models["m0"].swap_load_s("s3") == pytest.approx(16.06 / 2 + 0.3, rel=0.01)
    # Both are calibratable like the other figures, and not required of a costs file.
    f = tmp_path / "costs.json"
    f.write_text(json.dumps({"defaults": {"weights_gib": 1, "standby_load_s": 4, "asleep_load_s": 1,
                                          "release_s": 1, "prefill_tokens_per_s": 100, "tpot_s": 0.1},
                             "models": {"m0": {"engine_start_s": 3.5, "swap_s": 0.1}}}))
    got = cost_model(config(), overrides=read_overrides(f)).models["m0"]
    assert got.swap_load_s("s3") == pytest.approx(4 - 3.5 + 0.1)


def test_the_cli_shows_the_swap_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    cfg_file = tmp_path / "thaw.yaml"
    cfg_file.write_text(prebuild_config(["m0"]).model_dump_json(exclude={"data_dir"}))
    costs_file = tmp_path / "costs.json"
    costs_file.write_text(json.dumps({"defaults": {"weights_gib": 1, "standby_load_s": 10, "asleep_load_s": 1,
                                                   "release_s": 2, "prefill_tokens_per_s": 1000, "tpot_s": 0.01}}))
    tr_file = tmp_path / "trace.csv"
    tr_file.write_text("timestamp,model,tenant,input_tokens,output_tokens\n100,m1,t,100,100\n400,m0,t,100,100\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(tr_file), "--config", str(cfg_file), "--costs", str(costs_file),
                 "--out-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cold_starts_by_tier"] == {"swap": 2}
    err = capsys.readouterr().err
    assert "2 cold starts (swap 2)" in err and "pre-built engines (gpu: m0): 1 engine classes over 2 models" in err
    run = json.loads((out / "run.json").read_text())
    assert set(run["engine_classes"]) == {"m0", "m1"}
    assert [json.loads(line)["tier"] for line in (out / "cold_starts.jsonl").read_text().splitlines()] == ["swap"] * 2
