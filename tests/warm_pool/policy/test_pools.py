"""The per-shape half of ``decide``: standby sized by cold starts with hysteresis,
budgets that are never exceeded, and the stopped tier. Tick by tick with a clock the
test moves, and a property test over random fleets and budgets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from thaw.config import ThawConfig, parse_config
from warm_pool.policy.decide import (
    ModelActivity,
    ModelState,
    PolicyState,
    PoolState,
    Snapshot,
    WorkerView,
    decide,
)
from warm_pool.policy.decisions import Assign, Launch, Release, Start, Stop, Terminate

GPU = {"gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 48, "host_memory_gib": 64}


def config(pool: dict[str, Any] | None = None, price: float = 2.0, boot_s: float = 120.0,
           total: float | None = None, **autoscaling: Any) -> ThawConfig:
    p = {"shape": "gpu", "standby_min": 1, "standby_max": 4, "max_instances": 10, "standby_hold_s": 300}
    return parse_config({
        "controller": {"url": "http://controller.internal:8100"},
        "shapes": [{"name": "gpu", **GPU, "price_per_hour_usd": price, "boot_s": boot_s}],
        "pools": [{**p, **(pool or {})}],
        "models": [{"name": f"m{i}", "uri": f"s3://thaw/m{i}", "shape": "gpu",
                    "autoscaling": {"idle_grace_s": 60, "asleep_ttl_s": 0, **autoscaling}} for i in range(8)],
        "budget_usd_per_hour": total,
    })


def w(i: int, state: str, model: str | None = None, since: float | None = None) -> WorkerView:
    return WorkerView(f"w{i:02d}", "gpu", state, model, f"{model}-{i}" if model else None,  # type: ignore[arg-type]
                      since=since)


def launches(decisions: list[Any], reason: str = "standby") -> int:
    return sum(1 for d in decisions if isinstance(d, Launch) and d.reason == reason)


def test_cold_starts_raise_the_standby_target_at_once_and_it_falls_after_the_hold() -> None:
    cfg = config()
    state, t = PolicyState(), 1000.0
    # Three models wake from zero in the same tick, each taking a standby (three cold
    # starts): 3 / 600 s window x 60 = 0.3 per minute x 120 s boot / 60 = 0.6 -> 1...
    fleet = tuple(w(i, "standby") for i in range(3))
    act = {f"m{i}": ModelActivity(queued=1, last_request_at=t) for i in range(3)}
    decisions, state = decide(Snapshot(fleet, act), state, cfg, t)
    assert sum(isinstance(d, Assign) and d.reason == "demand" for d in decisions) == 3
    assert state.pools["gpu"].target is not None and state.pools["gpu"].target.target == 1
    # ... and 27 more cold starts within the window: 30 / 10 min = 3 a minute x 120 s / 60
    # = 6 -> standby_max 4, at once: 4 standbys launched (none stands by now).
    state = PolicyState(pools={"gpu": PoolState(cold_starts=(t,) * 30, sizer=state.pools["gpu"].sizer)},
                        models=state.models)
    serving = tuple(w(i, "ready", f"m{i}") for i in range(3))
    decisions, state = decide(Snapshot(serving, {}), state, cfg, t + 1)
    assert state.pools["gpu"].target.target == 4 and launches(decisions) == 4  # type: ignore[union-attr]
    fleet4 = serving + tuple(w(10 + i, "standby") for i in range(4))
    # Demand gone: the cold starts leave the 600 s window; the target holds for
    # standby_hold_s (300 s) below its lower watermark before it falls.
    t2 = t + 601
    decisions, state = decide(Snapshot(fleet4, {}), state, cfg, t2)
    assert not any(isinstance(d, Terminate) for d in decisions)
    decisions, state = decide(Snapshot(fleet4, {}), state, cfg, t2 + 299)
    assert not any(isinstance(d, Terminate) for d in decisions)
    decisions, state = decide(Snapshot(fleet4, {}), state, cfg, t2 + 300)
    assert sum(isinstance(d, Terminate) and d.reason == "excess_standby" for d in decisions) == 3  # down to 1


def test_the_pool_budget_holds_standby_and_serving_is_never_cut() -> None:
    # $2 an instance, $5 an hour: 2 serving ($4) leave $1: no standby at all.
    cfg = config({"budget_usd_per_hour": 5.0, "standby_min": 2})
    act = {"m0": ModelActivity(in_flight=4, last_request_at=99.0), "m1": ModelActivity(in_flight=1, last_request_at=99.0)}
    fleet = (w(0, "ready", "m0"), w(1, "ready", "m1"))
    decisions, state = decide(Snapshot(fleet, act), PolicyState(), cfg, 100.0)
    assert launches(decisions) == 0 and not any(isinstance(d, Release) for d in decisions)
    g = state.pools["gpu"].grant
    assert g is not None and (g.standby, g.shortfall) == (0, 2)


def test_the_global_budget_releases_asleep_replicas_before_it_cuts_standby() -> None:
    cfg = config({"standby_min": 1, "standby_max": 1}, total=4.0, asleep_ttl_s=3600)
    # One asleep ($2) + the standby target 1 ($2) = $4: fits. A second asleep would not:
    # asleep go first, the longest asleep.
    fleet = (w(0, "asleep", "m0", since=10.0), w(1, "asleep", "m1", since=50.0), w(2, "standby"))
    decisions, _ = decide(Snapshot(fleet, {}), PolicyState(), cfg, 100.0)
    assert Release("w00", "m0", "budget") in decisions
    assert Release("w01", "m1", "budget") not in decisions
    assert not any(isinstance(d, Terminate) for d in decisions)


def test_the_stopped_tier_is_used_before_launches_and_takes_excess_before_terminations() -> None:
    ec2 = {"provider": "ec2", "ec2": {"region": "us-east-1", "launch_template": "lt", "subnets": ["s"],
                                      "instance_types": ["g6e.xlarge"]},
           "standby_min": 2, "standby_max": 2, "stopped_standby_min": 0, "stopped_standby_max": 2}
    cfg = config(ec2)
    # Short by one, one stopped: start it rather than launch.
    decisions, _ = decide(Snapshot((w(0, "standby"), w(1, "stopped")), {}), PolicyState(), cfg, 100.0)
    assert decisions == [Start("w01", "standby")]
    # Two too many standing by, room for two stopped: stop them instead of terminating.
    fleet = tuple(w(i, "standby") for i in range(4))
    decisions, _ = decide(Snapshot(fleet, {}), PolicyState(), cfg, 100.0)
    assert sorted(d.worker_id for d in decisions if isinstance(d, Stop)) == ["w02", "w03"]
    assert not any(isinstance(d, Terminate) for d in decisions)


def test_a_launch_backoff_holds_standby_launches_but_not_the_rest() -> None:
    cfg = config({"standby_min": 2})
    snap = Snapshot((), {}, launch_blocked_until={"gpu": 200.0})
    assert launches(decide(snap, PolicyState(), cfg, 100.0)[0]) == 0
    assert launches(decide(snap, PolicyState(), cfg, 200.0)[0]) == 2


STATES = ["standby", "ready", "loading", "asleep", "launching", "starting", "draining"]


@settings(max_examples=300, deadline=None, database=None)
@given(
    workers=st.lists(st.sampled_from(STATES), max_size=10),
    demand=st.lists(st.integers(0, 20), min_size=8, max_size=8),
    price=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.3]),
    pool_budget=st.one_of(st.none(), st.floats(0, 30)),
    total=st.one_of(st.none(), st.floats(0, 30)),
    standby=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    colds=st.integers(0, 60),
)
def test_standby_and_asleep_spend_never_exceed_a_budget(workers: list[str], demand: list[int], price: float,
                                                         pool_budget: float | None, total: float | None,
                                                         standby: tuple[int, int], colds: int) -> None:
    lo, hi = min(standby), max(standby)
    cfg = config({"standby_min": lo, "standby_max": hi, "budget_usd_per_hour": pool_budget}, price=price,
                 total=total, asleep_ttl_s=3600)
    fleet = tuple(w(i, s, f"m{i % 8}" if s in ("ready", "loading", "asleep") else None, since=1.0)
                  for i, s in enumerate(workers))
    act = {f"m{i}": ModelActivity(in_flight=d, last_request_at=99.0) for i, d in enumerate(demand) if d}
    state = PolicyState(pools={"gpu": PoolState(cold_starts=(90.0,) * colds)})
    decisions, new = decide(Snapshot(fleet, act), state, cfg, 100.0)
    assigned = {d.worker_id for d in decisions if isinstance(d, Assign)}
    released = {d.worker_id for d in decisions if isinstance(d, Release | Terminate | Stop)}
    # What the fleet holds after these decisions, apart from serving replicas (and
    # instances still booting: one is removed on the tick it stands by, if in excess).
    standby_after = sum(1 for v in fleet if v.state == "standby"
                        and v.id not in assigned | released) + launches(decisions)
    asleep_after = sum(1 for v in fleet if v.state == "asleep" and v.id not in assigned | released)
    serving = sum(1 for v in fleet if v.state in ("ready", "loading")) + launches(decisions, "demand")
    spend = (standby_after + asleep_after) * price
    # Standby (and asleep) instances beyond what a budget pays for are never added; ones
    # that were already there over a new budget are removed this very tick.
    for budget in (pool_budget, total):
        if budget is not None and price > 0:
            assert spend <= max(budget - serving * price, 0.0) + 1e-6, (spend, budget, serving, decisions)
    g = new.pools["gpu"].grant
    assert g is not None
    # The target stays in the operator's band whenever a budget allows it.
    target = new.pools["gpu"].target
    assert target is not None and lo <= target.target <= hi


def test_the_histogram_keep_alive_lets_go_at_once_and_pre_warms_before_the_next_request() -> None:
    from warm_pool.policy.keepalive import IdleHistogram

    # A cold start worth 10 minutes of idle replica. Thirty idle gaps of 10-11 minutes
    # (bin 10 of 60 s): holding across each costs ~630 s, a cold start 600 s; holding from
    # the predicted arrival costs ~30 s: pre-warm with the replica asked for 60 s ahead
    # (600 - 60 = 540 s after the idle start), kept until 660 s.
    cfg = config({"standby_min": 1}, keep_alive="histogram", keep_alive_histogram={"cold_start_price_s": 600, "smoothing": 0})
    learnt = IdleHistogram(counts=(0,) * 10 + (30,))
    state = PolicyState(models={"m0": ModelState(idle_histogram=learnt)})
    idle = {"m0": ModelActivity(last_request_at=1000.0)}
    # The request ended at 1000: the replica goes at once (no fixed 60 s wait)...
    decisions, state = decide(Snapshot((w(0, "ready", "m0"), w(1, "standby")), idle), state, cfg, 1001.0)
    assert Release("w00", "m0", "idle") in decisions
    window = state.models["m0"].keep_alive
    assert window is not None and window.mode == "histogram"
    # ... nothing while the model is unlikely to be called (at 1500: 500 s < 540 s) ...
    decisions, state = decide(Snapshot((w(1, "standby"), w(2, "standby")), idle), state, cfg, 1500.0)
    assert not any(isinstance(d, Assign) for d in decisions)
    # ... a standby is assigned ahead of the next request (at 1541: 541 s >= 540 s) ...
    decisions, state = decide(Snapshot((w(1, "standby"), w(2, "standby")), idle), state, cfg, 1541.0)
    assert [d.reason for d in decisions if isinstance(d, Assign)] == ["prewarm"]
    # ... and released when the window closes without one (at 1660: 660 s >= 660 s).
    decisions, state = decide(Snapshot((w(1, "ready", "m0"), w(2, "standby")), idle), state, cfg, 1659.0)
    assert not any(isinstance(d, Release) for d in decisions)
    decisions, state = decide(Snapshot((w(1, "ready", "m0"), w(2, "standby")), idle), state, cfg, 1660.0)
    assert Release("w01", "m0", "idle") in decisions


def test_the_wait_for_a_models_first_request_is_its_first_idle_interval() -> None:
    cfg = config({"standby_min": 1}, keep_alive="histogram")
    standby = (w(1, "standby"),)
    # First seen at 1000: nothing of m0, m1's request already waiting, m2 used before
    # this controller (an activator reports its last request, from 900).
    first = {"m1": ModelActivity(in_flight=1, last_request_at=1000.0), "m2": ModelActivity(last_request_at=900.0)}
    _, state = decide(Snapshot(standby, first), PolicyState(), cfg, 1000.0)
    assert state.models["m0"].seen_since == 1000.0 and state.models["m1"].seen_since is None
    assert state.models["m2"].seen_since is None and state.models["m2"].idle_since == 900.0
    # m0's first request, 3,000 s later: an interval of 3,000 s (bin 50 of 60 s), learnt.
    _, state = decide(Snapshot(standby, {"m0": ModelActivity(in_flight=1, last_request_at=4000.0)}),
                      state, cfg, 4000.0)
    learnt = state.models["m0"].idle_histogram
    assert learnt.total() == 1 and learnt.counts[50] == 1 and state.models["m0"].seen_since is None
    # m1 showed no wait, and m2's gap is counted from its last request, as any other.
    _, state = decide(Snapshot(standby, {"m1": ModelActivity(in_flight=1, last_request_at=4000.0),
                                         "m2": ModelActivity(in_flight=1, last_request_at=4000.0)}),
                      state, cfg, 4000.0)
    assert state.models["m1"].idle_histogram.total() == 0
    assert state.models["m2"].idle_histogram.counts == (0,) * 51 + (1,)  # 3,100 s: bin 51


def test_a_model_with_no_history_takes_its_keep_alive_from_the_others_and_holds_it_for_the_idle_period() -> None:
    from warm_pool.policy.keepalive import IdleHistogram

    cfg = config({"standby_min": 1}, keep_alive="histogram", keep_alive_histogram={"cold_start_price_s": 600, "smoothing": 0})
    # m1 learnt gaps of 10-11 minutes; m0, new, has none of its own.
    state = PolicyState(models={"m1": ModelState(idle_histogram=IdleHistogram(counts=(0,) * 10 + (30,)))})
    idle = {"m0": ModelActivity(last_request_at=1000.0)}
    decisions, state = decide(Snapshot((w(0, "ready", "m0"), w(1, "standby")), idle), state, cfg, 1001.0)
    # m0 is pre-warmed on m1's pattern: let go at once, a replica asked for at 540 s.
    assert Release("w00", "m0", "idle") in decisions
    window = state.models["m0"].keep_alive
    assert window is not None and (window.prewarm_after_s, window.keep_until_s) == (540.0, 660.0)
    assert "0 own intervals, pooled prior x10" in window.reason
    # The pool moving during the idle period (m1 learns 30 gaps of 30 s) leaves m0's window.
    short = IdleHistogram(counts=(30,) + (0,) * 9 + (30,))
    state = PolicyState(models={**state.models, "m1": ModelState(idle_histogram=short)}, pools=state.pools,
                        idle_pools=state.idle_pools)
    decisions, state = decide(Snapshot((w(1, "standby"), w(2, "standby")), idle), state, cfg, 1541.0)
    assert [d.reason for d in decisions if isinstance(d, Assign)] == ["prewarm"]
    assert state.models["m0"].keep_alive == window


def test_instances_booting_for_demand_are_not_taken_for_excess_standby() -> None:
    # min_replicas 2 on max_instances 2: two launches for the model, both still booting,
    # and no room for a standby. Nothing is terminated while they boot (a storm of
    # launches and terminations otherwise).
    cfg = parse_config({
        "shapes": [{"name": "gpu", **GPU, "price_per_hour_usd": 1.0}],
        "pools": [{"shape": "gpu", "standby_min": 0, "standby_max": 1, "max_instances": 2}],
        "models": [{"name": "m0", "uri": "s3://thaw/m0", "shape": "gpu",
                    "autoscaling": {"min_replicas": 2, "max_replicas": 2}}],
    })
    fleet = (w(0, "starting"), w(1, "starting"))
    decisions, _ = decide(Snapshot(fleet, {}), PolicyState(), cfg, 100.0)
    assert not any(isinstance(d, Terminate | Launch) for d in decisions)
    # Once they stand by, the model takes both.
    decisions, _ = decide(Snapshot((w(0, "standby"), w(1, "standby")), {}), PolicyState(), cfg, 101.0)
    assert sorted(d.worker_id for d in decisions if isinstance(d, Assign)) == ["w00", "w01"]
    assert not any(isinstance(d, Terminate) for d in decisions)


def test_a_cold_start_counts_once_and_the_longest_waiting_model_gets_the_next_standby() -> None:
    cfg = config()
    t = 1000.0
    # m5 waits from t with no standby (a launch boots for it); m1 from t + 10.
    waiting = {"m5": ModelActivity(queued=1, last_request_at=t)}
    fleet = (w(0, "launching"),)
    _, state = decide(Snapshot(fleet, waiting), PolicyState(), cfg, t)
    waiting["m1"] = ModelActivity(queued=1, last_request_at=t + 10)
    for dt in range(10, 60, 5):
        _, state = decide(Snapshot(fleet, waiting), state, cfg, t + dt)
    # Two cold starts counted, however many ticks they waited.
    assert len(state.pools["gpu"].cold_starts) == 2
    # One standby appears: m5 (waiting longer) gets it, though m1 comes first in the config.
    decisions, state = decide(Snapshot((w(0, "standby"),), waiting), state, cfg, t + 60)
    assert [(d.worker_id, d.model) for d in decisions if isinstance(d, Assign)] == [("w00", "m5")]
