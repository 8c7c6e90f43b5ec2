"""The pool policy, stepped by hand: snapshot + state + now in, decisions + state out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from thaw.config import ThawConfig, parse_config
from thaw.wire import CachedWeights
from warm_pool.policy.decide import (
    CRASH_WINDOW_S,
    ModelActivity,
    PolicyState,
    Snapshot,
    WorkerView,
    backoff_s,
    decide,
    expected_load,
)
from warm_pool.policy.decisions import Assign, Launch, Release, Sleep, Terminate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"


def config(**autoscaling: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["autoscaling"].update({"idle_grace_s": 60, "max_replicas": 3, "target_concurrency": 4})
    data["models"][0]["autoscaling"].update(autoscaling)
    data["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 3})
    return parse_config(data)


def standby(i: int) -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", "standby")


def serving(i: int, state: str = "ready", model: str = "demo") -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", state, model, f"{model}-{i}")  # type: ignore[arg-type]


def kinds(decisions: list[Any]) -> list[str]:
    return [type(d).__name__ for d in decisions]


def test_request_at_zero_assigns_a_standby_at_once() -> None:
    snap = Snapshot((standby(1),), {"demo": ModelActivity(queued=1, last_request_at=100.0)})
    decisions, state = decide(snap, PolicyState(), config(), now=100.0)
    # The standby goes to the model, and a new standby is launched to refill the pool.
    assert decisions == [Assign("w1", "demo", "demo-1"), Launch("cpu-local", "standby")]
    assert state.assignments == 1


def test_no_traffic_no_replicas_nothing_to_do() -> None:
    snap = Snapshot((standby(1),), {})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert decisions == []


def test_demand_without_standby_launches_within_caps() -> None:
    snap = Snapshot((), {"demo": ModelActivity(queued=2, last_request_at=5.0)})
    decisions, _ = decide(snap, PolicyState(), config(), now=5.0)
    # One launch for the demand; the standby target (1) is covered by it.
    assert kinds(decisions) == ["Launch", "Launch"]
    assert {d.reason for d in decisions if isinstance(d, Launch)} == {"demand", "standby"}


def test_a_launching_worker_is_not_launched_again() -> None:
    snap = Snapshot((WorkerView("launching-1", "cpu-local", "launching"),),
                    {"demo": ModelActivity(queued=1, last_request_at=5.0)})
    decisions, _ = decide(snap, PolicyState(), config(), now=5.0)
    assert decisions == []


def test_loading_replica_is_not_duplicated_while_requests_queue() -> None:
    snap = Snapshot((serving(1, "loading"), standby(2)), {"demo": ModelActivity(queued=3, last_request_at=5.0)})
    decisions, _ = decide(snap, PolicyState(), config(), now=5.0)
    # ceil(3 queued / 4 per replica) = 1 replica wanted, one is loading: nothing to assign.
    assert decisions == []


def test_scale_up_takes_standbys_then_launches() -> None:
    # 1 ready, demand 9 → ceil(9/4) = 3 wanted: 1 standby assigned, 1 launch for the rest.
    snap = Snapshot((serving(1), standby(2)), {"demo": ModelActivity(queued=5, in_flight=4, last_request_at=5.0)})
    decisions, _ = decide(snap, PolicyState(assignments=1), config(max_scale_up_rate=10), now=5.0)
    assert Assign("w2", "demo", "demo-2", "scale_up") in decisions
    assert Launch("cpu-local", "demand") in decisions


def test_a_step_up_is_bounded_by_max_scale_up_rate() -> None:
    # The same demand with max_scale_up_rate 2: max(1 + 1, 1 x 2) = 2 replicas this step.
    snap = Snapshot((serving(1), standby(2)), {"demo": ModelActivity(queued=5, in_flight=4, last_request_at=5.0)})
    decisions, state = decide(snap, PolicyState(assignments=1), config(max_scale_up_rate=2), now=5.0)
    assert Assign("w2", "demo", "demo-2", "scale_up") in decisions
    assert Launch("cpu-local", "demand") not in decisions
    last = state.models["demo"].last_scale
    assert last is not None and (last.raw, last.bounded, last.target) == (3, 2, 2)


@pytest.mark.parametrize(
    ("last_request_at", "in_flight", "released"),
    [
        (100.0, 0, True),    # 160 - 100 = 60 s >= idle_grace_s 60: release
        (100.5, 0, False),   # 59.5 s < 60: keep
        (100.0, 1, False),   # a request still running: keep
        (None, 0, True),     # never used (e.g. min_replicas lowered): release
    ],
)
def test_scale_to_zero_after_idle_grace(last_request_at: float | None, in_flight: int, released: bool) -> None:
    snap = Snapshot((serving(1), standby(2)),
                    {"demo": ModelActivity(0, in_flight, last_request_at)})
    decisions, _ = decide(snap, PolicyState(), config(), now=160.0)
    assert (Release("w1", "demo", "idle") in decisions) is released


def test_min_replicas_are_kept_and_filled_without_traffic() -> None:
    snap = Snapshot((serving(1), standby(2)), {})
    decisions, _ = decide(snap, PolicyState(), config(min_replicas=2), now=1000.0)
    assert decisions[0] == Assign("w2", "demo", "demo-1", "min_replicas")
    assert not any(isinstance(d, Release) for d in decisions)


def test_failed_load_backs_off_exponentially_and_counts_once() -> None:
    cfg = config()
    failed = WorkerView("w1", "cpu-local", "failed", "demo", "demo-0", "no model at s3://x")
    act = {"demo": ModelActivity(queued=1, last_request_at=10.0)}
    decisions, state = decide(Snapshot((failed,), act), PolicyState(), cfg, now=10.0)
    assert Release("w1", "demo", "failed") in decisions
    ms = state.models["demo"]
    assert (ms.failures, ms.backoff_until, ms.last_error) == (1, 12.0, "no model at s3://x")  # 10 + 2

    # The same failure seen again on the next tick is not counted twice.
    _, state = decide(Snapshot((failed,), act), state, cfg, now=10.5)
    assert state.models["demo"].failures == 1

    # During the backoff a standby is not handed to the model...
    decisions, state = decide(Snapshot((standby(1),), act), state, cfg, now=11.0)
    assert not any(isinstance(d, Assign) for d in decisions)
    # ...after it, it is.
    decisions, state = decide(Snapshot((standby(1),), act), state, cfg, now=12.0)
    assert Assign("w1", "demo", "demo-1") in decisions

    # A second failure doubles the wait: 2 * 2 = 4 s.
    failed2 = WorkerView("w1", "cpu-local", "failed", "demo", "demo-1", "boom")
    _, state = decide(Snapshot((failed2,), act), state, cfg, now=20.0)
    assert (state.models["demo"].failures, state.models["demo"].backoff_until) == (2, 24.0)

    # A replica that becomes ready clears the failures.
    _, state = decide(Snapshot((serving(1),), act), state, cfg, now=30.0)
    assert state.models["demo"].failures == 0


def test_a_crash_after_serving_is_placed_again_at_once_and_a_crash_loop_backs_off() -> None:
    cfg = config()
    act = {"demo": ModelActivity(queued=3, last_request_at=10.0)}
    crashed = WorkerView("w1", "cpu-local", "failed", "demo", "demo-0", "engine exited while serving", served=True)
    decisions, state = decide(Snapshot((crashed, standby(2)), act), PolicyState(), cfg, now=10.0)
    # No backoff, no error for the activator to refuse with: the standby gets it now.
    assert Release("w1", "demo", "failed") in decisions
    assert any(isinstance(d, Assign) and d.worker_id == "w2" for d in decisions)
    ms = state.models["demo"]
    assert (ms.failures, ms.backoff_until, ms.last_error, ms.last_crash_at) == (0, 0.0, None, 10.0)
    # Seen again on the next tick: counted once.
    _, state = decide(Snapshot((crashed, serving(2)), act), state, cfg, now=10.5)
    assert state.models["demo"].last_crash_at == 10.0 and state.models["demo"].failures == 0

    # Another crash within the window: a crash loop, which backs off like a failed load.
    again = WorkerView("w2", "cpu-local", "failed", "demo", "demo-1", "engine exited while serving", served=True)
    decisions, state = decide(Snapshot((again, standby(3)), act), state, cfg, now=100.0)
    ms = state.models["demo"]
    assert (ms.failures, ms.backoff_until, ms.last_error) == (1, 102.0, "engine exited while serving")
    assert not any(isinstance(d, Assign) for d in decisions)

    # Past the window a crash is a first crash again.
    late = WorkerView("w3", "cpu-local", "failed", "demo", "demo-2", "engine exited while serving", served=True)
    later = 100.0 + CRASH_WINDOW_S + 1
    decisions, state = decide(Snapshot((late, standby(4)), act), state, cfg, now=later)
    assert any(isinstance(d, Assign) and d.worker_id == "w4" for d in decisions)
    assert state.models["demo"].last_crash_at == later


@pytest.mark.parametrize(("failures", "wait"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (10, 60.0)])
def test_backoff_schedule(failures: int, wait: float) -> None:
    assert backoff_s(failures) == wait  # 2 * 2**(n-1), capped at 60


def test_standby_pool_targets_caps_and_budget() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["shapes"][0]["price_per_hour_usd"] = 2.0
    data["pools"][0].update({"standby_min": 3, "standby_max": 3, "max_instances": 4, "budget_usd_per_hour": 5.0})
    cfg = parse_config(data)
    decisions, _ = decide(Snapshot((serving(1),), {}), PolicyState(), cfg, now=0.0)
    # 1 serving ($2) + launches while (total+1) * $2 <= $5: only one more fits.
    assert decisions == [Release("w1", "demo", "idle"), Launch("cpu-local", "standby")]


def test_excess_standby_and_unreachable_workers_are_terminated() -> None:
    snap = Snapshot((standby(1), standby(2), WorkerView("w3", "cpu-local", "unreachable")), {})
    decisions, _ = decide(snap, PolicyState(), config(), now=0.0)
    assert Terminate("w3", "unreachable") in decisions
    assert Terminate("w2", "excess_standby") in decisions  # standby_max 1: the newest goes
    assert Terminate("w1", "excess_standby") not in decisions


# -- the asleep tier (GPU: vLLM sleep mode) -----------------------------------------------
def gpu_config(**autoscaling: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["shapes"] = [{"name": "cpu-local", "gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 48,
                       "host_memory_gib": 64, "price_per_hour_usd": 0}]
    data["models"][0]["autoscaling"].update({"idle_grace_s": 60, "asleep_ttl_s": 600, **autoscaling})
    other = {**data["models"][0], "name": "other", "served_name": "other", "uri": "s3://thaw/models/other"}
    data["models"].append(other)
    data["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 3})
    return parse_config(data)


def asleep(i: int, since: float, model: str = "demo") -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", "asleep", model, f"{model}-{i}", since=since)


def test_idle_replica_goes_to_sleep_instead_of_release() -> None:
    # Last request at 0, idle_grace_s 60: at 61 the replica is idle.
    snap = Snapshot((serving(1), standby(2)), {"demo": ModelActivity(last_request_at=0.0)})
    decisions, _ = decide(snap, PolicyState(), gpu_config(), now=61.0)
    assert decisions == [Sleep("w1", "demo")]


def test_a_loading_replica_is_released_not_put_to_sleep() -> None:
    snap = Snapshot((serving(1, "loading"), standby(2)), {"demo": ModelActivity(last_request_at=0.0)})
    decisions, _ = decide(snap, PolicyState(), gpu_config(), now=61.0)
    assert decisions == [Release("w1", "demo", "idle")]


def test_demand_wakes_the_asleep_replica_before_using_a_standby() -> None:
    snap = Snapshot((asleep(1, since=100.0), standby(2)), {"demo": ModelActivity(queued=1, last_request_at=200.0)})
    decisions, state = decide(snap, PolicyState(), gpu_config(), now=200.0)
    assert decisions == [Assign("w1", "demo", "demo-1")]  # the standby stays for others
    assert state.assignments == 1


def test_asleep_replica_is_released_after_its_ttl() -> None:
    # Asleep since 100, asleep_ttl_s 600: kept at 699, released at 700.
    snap = Snapshot((asleep(1, since=100.0), standby(2)), {"demo": ModelActivity(last_request_at=0.0)})
    assert decide(snap, PolicyState(), gpu_config(), now=699.0)[0] == []
    assert decide(snap, PolicyState(), gpu_config(), now=700.0)[0] == [Release("w1", "demo", "asleep_expired")]


def test_asleep_worker_of_a_model_without_the_tier_is_released() -> None:
    snap = Snapshot((asleep(1, since=100.0), standby(2)), {})
    decisions, _ = decide(snap, PolicyState(), gpu_config(asleep_ttl_s=0), now=101.0)
    assert decisions == [Release("w1", "demo", "asleep_expired")]


def test_another_model_without_a_standby_reclaims_an_asleep_worker_instead_of_launching() -> None:
    # No standby: "other" takes demo's asleep worker (released now, assigned once standby).
    snap = Snapshot((asleep(1, since=100.0), serving(2, model="other")),
                    {"other": ModelActivity(queued=9, last_request_at=200.0)})
    cfg = gpu_config(target_concurrency=4, max_replicas=3, max_scale_up_rate=10)
    decisions, _ = decide(snap, PolicyState(), cfg, now=200.0)
    # ceil(9 / 4) = 3 replicas wanted for "other", 1 serving: 2 more. One reclaims the
    # asleep worker, one launches: 2 instances + 1 = max_instances (3), so the standby
    # target gets none.
    assert Release("w1", "demo", "reclaimed") in decisions
    assert [d.reason for d in decisions if isinstance(d, Launch)] == ["demand"]


def test_asleep_workers_do_not_count_as_standbys() -> None:
    snap = Snapshot((asleep(1, since=100.0),), {})
    decisions, _ = decide(snap, PolicyState(), gpu_config(), now=101.0)
    assert decisions == [Launch("cpu-local", "standby")]


def test_a_draining_worker_counts_as_a_standby_on_its_way() -> None:
    snap = Snapshot((WorkerView("w1", "cpu-local", "draining"),), {})
    assert decide(snap, PolicyState(), gpu_config(), now=101.0)[0] == []


def test_a_draining_worker_does_not_make_a_ready_standby_excess() -> None:
    # standby_max 1: one standby + one draining is not over it (the standby is usable now).
    snap = Snapshot((standby(1), WorkerView("w2", "cpu-local", "draining")), {})
    assert decide(snap, PolicyState(), gpu_config(), now=101.0)[0] == []


def test_asleep_tier_needs_a_gpu_shape() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["autoscaling"]["asleep_ttl_s"] = 60
    with pytest.raises(Exception, match="asleep_ttl_s needs vLLM's sleep mode, which needs a GPU"):
        parse_config(data)


def test_requests_that_came_and_went_between_ticks_keep_the_model_warm() -> None:
    # Arrivals since the last tick but nothing in flight now: the model went idle again
    # at the last request's end (159 s), so idle_grace_s (60 s) runs from there.
    snap = Snapshot((serving(1), standby(2)), {"demo": ModelActivity(0, 0, last_request_at=159.0, arrivals=3)})
    decisions, state = decide(snap, PolicyState(), config(), now=160.0)
    assert not any(isinstance(d, Release) for d in decisions)
    assert state.models["demo"].idle_since == 159.0


# -- placement: the standby that loads the model soonest ------------------------------


def holding(i: int, uri: str, **tiers: int) -> WorkerView:
    """A standby holding ``tiers`` bytes of ``uri`` (e.g. host=100, disk=100) of 100."""
    cached = tuple(CachedWeights(uri=uri, tier=t, bytes=n, total_bytes=100) for t, n in tiers.items())
    return WorkerView(f"w{i}", "cpu-local", "standby", cached=cached)


def placed(workers: tuple[WorkerView, ...], **autoscaling: Any) -> Assign:
    cfg = config(**autoscaling)
    snap = Snapshot(workers, {"demo": ModelActivity(queued=1, last_request_at=100.0)})
    decisions, _ = decide(snap, PolicyState(), cfg, now=100.0)
    [a] = [d for d in decisions if isinstance(d, Assign)]
    return a


def test_placement_prefers_host_memory_then_disk_then_any_standby() -> None:
    uri = config().models[0].uri
    other = "s3://thaw/models/other"
    a = placed((standby(1), holding(2, uri, disk=100), holding(3, uri, host=100, disk=100), holding(4, other, host=100)))
    assert (a.worker_id, a.tier) == ("w3", "host")
    a = placed((standby(1), holding(2, uri, disk=100), holding(4, other, host=100)))
    assert (a.worker_id, a.tier) == ("w2", "disk")
    a = placed((holding(4, other, host=100), standby(1)))
    assert (a.worker_id, a.tier) == ("w1", "s3")  # ties keep the id order
    # A partial copy is worth its part: 60 bytes from disk beat 30 from host memory.
    a = placed((holding(1, uri, host=30), holding(2, uri, disk=60)))
    assert a.worker_id == "w2" and a.tier == "s3"


def test_placement_uses_the_rates_each_worker_measured() -> None:
    uri = config().models[0].uri
    # This worker's disk reads at 10 B/s, its store at 1 GB/s: the store is sooner.
    slow_disk = WorkerView("w1", "cpu-local", "standby",
                           cached=(CachedWeights(uri=uri, tier="disk", bytes=100, total_bytes=100),),
                           load_rates=(("disk", 10.0),))
    a = placed((slow_disk, standby(2)))
    assert a.worker_id == "w2"
    seconds, tier = expected_load(slow_disk, uri, 100)
    assert (seconds, tier) == (10.0, "disk")


def test_an_asleep_replica_still_beats_any_cached_standby() -> None:
    uri = config().models[0].uri
    snap = Snapshot((holding(1, uri, host=100), asleep(9, since=99.0)),
                    {"demo": ModelActivity(queued=1, last_request_at=100.0)})
    decisions, _ = decide(snap, PolicyState(), gpu_config(), now=100.0)
    assert decisions == [Assign("w9", "demo", "demo-1")]


def test_excess_standby_keeps_the_one_holding_weights_in_memory() -> None:
    uri = config().models[0].uri
    # standby_max 1: one of the two goes; by id alone it would be w2 (the newest).
    snap = Snapshot((standby(1), holding(2, uri, host=100)), {})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert decisions == [Terminate("w1", "excess_standby")]


def test_a_standby_holding_weights_is_not_traded_for_one_still_booting() -> None:
    uri = config().models[0].uri
    snap = Snapshot((holding(1, uri, host=100), WorkerView("w2", "cpu-local", "starting")), {})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert decisions == []  # w2 goes once it stands by (the test above)
