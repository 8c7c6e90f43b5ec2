"""LoRA adapters in the simulator: the policy's ``LoadAdapter`` and ``UnloadAdapter``
carried out on the engines of the base, adapter requests served in those engines'
slots, the "adapter" tier, and the fast mode judging a base with its adapters."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from simulator.costs import ADAPTER_LOAD_S, ADAPTER_UNLOAD_S, cost_model, read_overrides
from simulator.run import with_trace_models
from simulator.sim import SUMMARY_KEYS, TIERS, Simulator, engine_classes, engine_sizes
from tests.simulator.support import config, costs, equivalence_cfg, trace, with_adapters
from thaw.config import ThawConfig
from warm_pool.policy.decisions import Assign, LoadAdapter, Release, UnloadAdapter


def adapter_config(**kw: Any) -> ThawConfig:
    """``config(3)``: one standby (boot 60 s), m0 a base kept 100 s idle, m1 and m2 its
    adapters, each kept 30 s idle. Loads take 10 s, an adapter's 0.05 s, its unload 0.4 s;
    100 prompt tokens take 0.1 s, 100 output tokens 1 s."""
    return with_adapters(config(3, idle_grace_s=100, **kw), {"m1": "m0", "m2": "m0"}, idle_grace_s=30)


def run(cfg: ThawConfig, rows: list[tuple[float, str, int, int]], **kw: Any) -> Any:
    return Simulator(cfg, costs(cfg), trace(rows), record_decisions=True, **kw).run()


def test_an_adapter_is_loaded_into_a_live_base_and_serves_at_adapter_speed() -> None:
    # m0 at 0 takes the standby: ready at 10, answered by 11.1. m1 at 20 finds no engine
    # holding it: a cold start, which wakes the controller: LoadAdapter at 20 into the
    # ready engine of m0, ready at 20.05; TTFT 0.05 + 0.1.
    r = run(adapter_config(), [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100)])
    assert [(t, d) for t, d in r.decisions if isinstance(d, LoadAdapter)] == [
        (20.0, LoadAdapter("gpu-000001", "m1", "demand"))]
    assert [(c.model, c.tier) for c in r.cold_starts] == [("m0", "s3"), ("m1", "adapter")]
    assert r.cold_starts[1].ready_after_s == pytest.approx(ADAPTER_LOAD_S)
    per = r.summary["per_model"]
    assert per["m1"]["ttft_s"]["p50"] == pytest.approx(0.05 + 0.1)
    assert per["m1"]["cold_starts_by_tier"] == {"adapter": 1}
    assert r.summary["cold_starts_by_tier"] == {"adapter": 1, "s3": 1}


def test_an_idle_adapter_is_unloaded_while_its_base_serves_another() -> None:
    # m1 asks once at 20 (answered by 20.05 + 0.1 + 1 = 21.15), m2 every 5 s until 200.
    # m1's 30 s idle grace ends at 51.15: unloaded at the tick after, 52, gone at 52.4.
    # m2 stays loaded, and m0 stays: its adapters' traffic is its own.
    rows = [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100)] + [(20.0 + 5 * k, "m2", 100, 100) for k in range(37)]
    r = run(adapter_config(), rows)
    assert [(t, d) for t, d in r.decisions if isinstance(d, UnloadAdapter)] == [
        (52.0, UnloadAdapter("gpu-000001", "m1", "idle"))]
    assert not [d for _, d in r.decisions if isinstance(d, Release)]
    per = r.summary["per_model"]
    assert per["m1"]["adapter_seconds"] == pytest.approx(52.0 + ADAPTER_UNLOAD_S - 20.0)
    # m2's 37 requests: one cold start (an adapter load), the rest hot at 0.1 s.
    assert per["m2"]["cold_starts"] == 1 and per["m2"]["ttft_s"]["p50"] == pytest.approx(0.1)


@pytest.mark.parametrize(("case", "standby", "load_at", "tier", "ttft"), [
    # m0 at zero: m1's request is its base's demand: the standby takes m0 (ready at 10),
    # then m1 is loaded into it (10.05). The engine came from the store: tier s3.
    ("a standby", 1, 10.0, "s3", 10.15),
    # No standby: an instance is launched for m0 (boot 60 s, load 10 s): tier launch.
    ("a launch", 0, 70.0, "launch", 70.15),
])
def test_an_adapter_request_with_its_base_at_zero_brings_the_base_up(case: str, standby: int, load_at: float,
                                                                     tier: str, ttft: float) -> None:
    r = run(adapter_config(standby_min=standby, standby_max=standby), [(0.0, "m1", 100, 100)])
    [assign] = [(t, d.model) for t, d in r.decisions if isinstance(d, Assign)]
    assert assign == (load_at - 10.0, "m0"), case
    assert [(t, d.model) for t, d in r.decisions if isinstance(d, LoadAdapter)] == [(load_at, "m1")], case
    assert [(c.model, c.tier) for c in r.cold_starts] == [("m1", tier)], case
    assert r.summary["per_model"]["m1"]["ttft_s"]["p50"] == pytest.approx(ttft), case
    # The base's engine served only its adapter: the base pays for it; no cold start of its own.
    base = r.summary["per_model"]["m0"]
    assert base["requests"] == 0 and base["cold_starts"] == 0 and base["replica_seconds"] > 0


def test_adapter_requests_share_the_slots_of_the_base_engine() -> None:
    # One slot per engine (the base's max_concurrency_per_replica). m0's request holds it
    # from 10 to 20.1 (1000 output tokens). m1 at 12 is loaded by 12.05 and waits for
    # the slot; m0's second request at 13 waits behind it (the longest waiting goes
    # first): m1 at 20.1 (TTFT 20.1 - 12 + 0.1 = 8.2, done at 21.2), m0 at 21.2
    # (21.2 - 13 + 0.1 = 8.3).
    rows = [(0.0, "m0", 100, 1000), (12.0, "m1", 100, 100), (13.0, "m0", 100, 100)]
    r = run(adapter_config(max_concurrency_per_replica=1), rows)
    per = r.summary["per_model"]
    assert per["m1"]["ttft_s"]["p50"] == pytest.approx(8.2)
    assert sorted(per["m0"]["ttft_s"][p] for p in ("p50", "p99")) == pytest.approx([8.3, 10.1])
    assert [(c.model, c.tier) for c in r.cold_starts] == [("m0", "s3"), ("m1", "adapter")]


def test_a_request_for_an_adapter_being_unloaded_is_a_cold_start() -> None:
    # One adapter slot per engine (max_loras 1). m1 at 20 (1000 output tokens: answered
    # by 20.05 + 0.1 + 10 = 30.15). m2 at 25 waits for the slot. m1's idle grace (30 s)
    # ends at 60.15: unloaded at 61, gone at 61.4. A second m1 request at 61.2 finds it
    # unloading: no replica, a cold start again. At 62 both want the slot; m2, waiting
    # since 25, takes it (ready 62.05: TTFT 62.05 - 25 + 0.1). m2's grace ends at
    # 63.15 + 30: unloaded at 94, gone at 94.4, and m1 is loaded at 95 (ready 95.05:
    # TTFT 95.05 - 61.2 + 0.1).
    cfg = with_adapters(config(3, idle_grace_s=100, activation_timeout_s=120, max_replicas=1),
                        {"m1": "m0", "m2": "m0"}, max_loras=1, idle_grace_s=30, activation_timeout_s=120)
    rows = [(0.0, "m0", 100, 100), (20.0, "m1", 100, 1000), (25.0, "m2", 100, 100), (61.2, "m1", 100, 100)]
    r = run(cfg, rows)
    assert [(t, d.model) for t, d in r.decisions if isinstance(d, LoadAdapter)] == [
        (20.0, "m1"), (62.0, "m2"), (95.0, "m1")]
    assert [(t, d.model) for t, d in r.decisions if isinstance(d, UnloadAdapter)] == [(61.0, "m1"), (94.0, "m2")]
    per = r.summary["per_model"]
    assert per["m2"]["ttft_s"]["p50"] == pytest.approx(62.05 - 25 + 0.1)
    assert per["m1"]["ttft_s"]["p99"] == pytest.approx(95.05 - 61.2 + 0.1)
    assert per["m1"]["cold_starts"] == 2 and per["m1"]["cold_starts_by_tier"] == {"adapter": 2}
    fast_exact(cfg, rows)


def test_an_excess_adapter_is_unloaded_once_its_requests_in_flight_are_answered() -> None:
    # m0 keeps two engines (min_replicas 2); m1 scales on one request per engine, over
    # a 2 s window. Two m1 requests at 20: loaded into both engines (ready at 20.05),
    # both admitted to gpu-000001 (the first ready), answered by 30.15 and 50.15 (1000
    # and 3000 output tokens); one at 20.5 goes to gpu-000002. From 30.15 one request is
    # left: at 32 the excess copy goes, gpu-000001's (the lower id), which unloads only
    # after its request ends at 50.15: gone at 50.55. m0's request at 60 (hot: 0.1 + 1 s) ends
    # the run at 61.1, with m1 still in gpu-000002.
    cfg = with_adapters(config(2, idle_grace_s=100, standby_min=2, standby_max=2, min_replicas=2, max_replicas=2),
                        {"m1": "m0"}, max_replicas=2, target_concurrency=1, min_replicas=0, downscale_delay_s=0,
                        stable_window_s=2, panic_window_s=1)
    rows = [(20.0, "m1", 100, 1000), (20.0, "m1", 100, 3000), (20.5, "m1", 100, 100), (60.0, "m0", 100, 100)]
    r = run(cfg, rows)
    assert [(t, d) for t, d in r.decisions if isinstance(d, UnloadAdapter)] == [
        (32.0, UnloadAdapter("gpu-000001", "m1", "excess"))]
    assert r.end_s == pytest.approx(61.1)
    held = (50.15 + ADAPTER_UNLOAD_S - 20) + (61.1 - 20)
    assert r.summary["per_model"]["m1"]["adapter_seconds"] == pytest.approx(held)
    fast_exact(cfg, rows)


@pytest.mark.parametrize(("asleep_ttl_s", "gone", "tier", "ready_after_s"), [
    # Released: at 200 the standby takes m0 again from the store (10 s), then m1 (0.05 s).
    (0, "Release", "s3", 10.05),
    # Put to sleep: at 200 m0 is woken (1 s), then m1 is loaded into it at the next tick.
    (300, "Sleep", "asleep", 1.05),
])
def test_an_engine_released_or_put_to_sleep_takes_its_adapters_with_it(asleep_ttl_s: float, gone: str, tier: str,
                                                                        ready_after_s: float) -> None:
    # m1 keeps 300 s idle, its base 100 s: m0 goes at the tick after 21.15 + 100 (its
    # adapter's traffic is its own), 122, with m1 still loaded: no UnloadAdapter, and m1
    # was held 122 - 20 = 102 s, and again from its load after 200 until the run ends.
    cfg = with_adapters(config(3, idle_grace_s=100, asleep_ttl_s=asleep_ttl_s), {"m1": "m0", "m2": "m0"},
                        idle_grace_s=300)
    r = run(cfg, [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100), (200.0, "m1", 100, 100)])
    kinds = [(t, type(d).__name__) for t, d in r.decisions if getattr(d, "model", None) in ("m0", "m1")]
    assert (122.0, gone) in kinds and "UnloadAdapter" not in {k for _, k in kinds}
    assert [(c.model, c.tier) for c in r.cold_starts][-1] == ("m1", tier)
    assert r.cold_starts[-1].ready_after_s == pytest.approx(ready_after_s)
    load_at = 200 + ready_after_s - ADAPTER_LOAD_S
    assert r.summary["per_model"]["m1"]["adapter_seconds"] == pytest.approx(102 + r.end_s - load_at)
    fast_exact(cfg, [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100), (200.0, "m1", 100, 100)])


def fast_exact(cfg: ThawConfig, rows: list[tuple[float, str, int, int]]) -> None:
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    fast = Simulator(cfg, c, trace(rows), record_decisions=True).run()
    exact = Simulator(cfg, c, trace(rows), exact=True, record_decisions=True).run()
    assert fast.decisions == exact.decisions
    assert fast.summary == exact.summary


@pytest.mark.parametrize("variant", [8, 9])
def test_the_fast_mode_makes_the_controllers_decisions_with_adapters(variant: int) -> None:
    """Seeded traces beside the property test's: two adapters of m0 competing for its
    engines' adapter slots (8), and in packed engines with the asleep tier (9)."""
    cfg = equivalence_cfg(variant)
    loaded = tiers = 0
    for seed in range(12):
        rnd = random.Random(seed)
        span = rnd.choice([100, 400, 2000])
        rows = [(round(rnd.uniform(0, span), 3), f"m{rnd.randint(0, 3)}", rnd.randint(1, 4000),
                 rnd.randint(1, 400)) for _ in range(rnd.randint(5, 80))]
        fast_exact(cfg, rows)
        r = Simulator(cfg, costs(cfg), trace(rows), record_decisions=True).run()
        loaded += sum(isinstance(d, LoadAdapter) for _, d in r.decisions)
        tiers += r.summary["cold_starts_by_tier"].get("adapter", 0)
    assert loaded and tiers


def test_a_base_with_many_adapters_is_judged_with_them() -> None:
    """Six adapters of m0 and two of m4 on three adapter slots per engine: a base's
    decision follows its adapters' traffic, theirs its engines."""
    cfg = with_adapters(config(10, standby_min=1, standby_max=3, max_instances=8, boot_s=25, budget=8.0,
                               idle_grace_s=40, max_replicas=3, target_concurrency=2, max_concurrency_per_replica=4,
                               downscale_delay_s=5, stable_window_s=20, panic_window_s=4),
                        {**{f"m{i}": "m0" for i in (1, 2, 3, 5, 6, 7)}, "m8": "m4", "m9": "m4"},
                        max_loras=3, idle_grace_s=10)
    for seed in range(4):
        rnd = random.Random(seed)
        fast_exact(cfg, [(round(rnd.uniform(0, 1000), 3), f"m{rnd.randint(0, 9)}", rnd.randint(1, 4000),
                          rnd.randint(1, 400)) for _ in range(300)])


def test_the_summary_has_a_row_per_adapter_and_the_base_pays_for_the_engine() -> None:
    r = run(adapter_config(), [(0.0, "m0", 100, 100), (20.0, "m1", 100, 100)])
    s = r.summary
    assert tuple(s) == SUMMARY_KEYS
    per = s["per_model"]
    assert set(per) == {"m0", "m1"}
    # The run ends with m1's answer at 21.15: the engine served 0-21.15 and is m0's.
    assert per["m1"] | {"ttft_s": None, "cold_start_s": None} == {
        "requests": 1, "cold_starts": 1, "cold_start_share": 1.0, "replica_seconds": 0.0, "asleep_seconds": 0.0,
        "usd": 0.0, "ttft_s": None, "slo_met_share": 1.0, "activation_timeouts": 0, "queue_full": 0,
        "capacity_refusals": 0, "evictions": 0, "cold_start_s": None, "cold_starts_by_tier": {"adapter": 1}, "base": "m0",
        "adapter_seconds": pytest.approx(21.15 - 20.0)}
    assert per["m0"]["replica_seconds"] == pytest.approx(21.15) and "base" not in per["m0"]
    assert per["m0"]["usd"] == pytest.approx(s["usd"] - s["standby_seconds"] * 0.001)
    assert s["requests"] == 2 and s["replica_seconds"] == per["m0"]["replica_seconds"]


def test_an_adapter_is_no_engine() -> None:
    data = adapter_config().model_dump()
    data["pools"][0]["pack"] = True
    data["pools"][0]["prebuild"] = []
    cfg = ThawConfig.model_validate(data)
    assert set(engine_sizes(cfg, costs(cfg))) == {"m0"}
    data["pools"][0] |= {"pack": False, "prebuild": ["m0"]}
    cfg = ThawConfig.model_validate(data)
    assert set(engine_classes(cfg, costs(cfg))) == {"m0"}


def test_adapter_is_the_second_fastest_tier() -> None:
    assert TIERS[:3] == ("asleep", "adapter", "swap")


def test_the_adapter_figures_default_to_the_measured_ones_and_can_be_given(tmp_path: Path) -> None:
    cfg = adapter_config()
    c = cost_model(cfg).models["m1"]
    assert (c.adapter_load_s, c.adapter_unload_s) == (0.05, 0.4) == (ADAPTER_LOAD_S, ADAPTER_UNLOAD_S)
    f = tmp_path / "costs.json"
    f.write_text(json.dumps({"defaults": {"weights_gib": 1, "standby_load_s": 4, "asleep_load_s": 1, "release_s": 1,
                                          "prefill_tokens_per_s": 100, "tpot_s": 0.1},
                             "models": {"m1": {"adapter_load_s": 0.5, "adapter_unload_s": 2}}}))
    got = cost_model(cfg, overrides=read_overrides(f)).models
    assert (got["m1"].adapter_load_s, got["m1"].adapter_unload_s) == (0.5, 2.0)
    assert got["m2"].adapter_load_s == ADAPTER_LOAD_S  # not required of a costs file
    # A slower load shows in the adapter's cold start.
    r = Simulator(cfg, cost_model(cfg, overrides=read_overrides(f)),
                  trace([(0.0, "m0", 100, 100), (20.0, "m1", 100, 100)])).run()
    assert [round(c.ready_after_s, 3) for c in r.cold_starts if c.model == "m1"] == [0.5]


def test_trace_models_copied_from_an_adapter_are_adapters_of_its_base() -> None:
    cfg = with_trace_models(adapter_config(), trace([(0.0, "t1", 1, 1)]), "m1")
    added = cfg.model("t1")
    assert added is not None and added.base == "m0" and added.adapter_uri == added.uri
    r = Simulator(cfg, costs(cfg), trace([(0.0, "m0", 100, 100), (20.0, "t1", 100, 100)])).run()
    assert r.summary["per_model"]["t1"]["cold_starts_by_tier"] == {"adapter": 1}


def test_the_cli_shows_the_adapter_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thaw.cli.main import main

    cfg_file = tmp_path / "thaw.yaml"
    cfg_file.write_text(adapter_config().model_dump_json(exclude={"data_dir"}))
    costs_file = tmp_path / "costs.json"
    costs_file.write_text(json.dumps({"defaults": {"weights_gib": 1, "standby_load_s": 10, "asleep_load_s": 1,
                                                   "release_s": 0, "prefill_tokens_per_s": 1000, "tpot_s": 0.01}}))
    tr_file = tmp_path / "trace.csv"
    tr_file.write_text("timestamp,model,tenant,input_tokens,output_tokens\n0,m0,t,100,100\n20,m1,t,100,100\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(tr_file), "--config", str(cfg_file), "--costs", str(costs_file),
                 "--out-dir", str(out)]) == 0
    assert "2 cold starts (adapter 1, s3 1)" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_model"]["m1"]["base"] == "m0"
    assert [json.loads(line)["tier"] for line in (out / "cold_starts.jsonl").read_text().splitlines()] == [
        "s3", "adapter"]
