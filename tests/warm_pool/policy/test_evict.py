"""Under pressure, idle yields to waiting (``warm_pool.policy.evict``), stepped by hand:
a model waiting at zero in a pool that can add no instance takes the least recently
used idle replica of another model; a replica in flight, a floor, a pre-warm window or
batch work is never taken; with nothing to take, the model is refused (after a grace
of a few seconds for the activators' reports to catch up) instead of timing out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from thaw.config import ThawConfig, parse_config
from thaw.units import GiB
from thaw.wire import WorkerState
from warm_pool.policy.decide import (
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
)
from warm_pool.policy.decisions import Assign, Launch, Pack, Release
from warm_pool.policy.evict import CAPACITY_GRACE_S as GRACE
from warm_pool.policy.settle import settled
from warm_pool.routes import route_table

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"
FULL = "pool cpu-local is at max_instances {} and every replica is busy"
NOW = 10_000.0


def config(models: str = "abcd", *, max_instances: int = 1, pack: bool = False, price: float = 0.0,
           budget: float | None = None, **per_model: dict[str, Any]) -> ThawConfig:
    """Models named by the letters of ``models``, copies of the example's (keep-alive
    600 s); ``per_model``: a model's extra settings (``autoscaling`` merged)."""
    data = yaml.safe_load(EXAMPLE.read_text())
    demo = data["models"][0]
    data["models"] = []
    for name in models:
        m = {**demo, "name": name, "served_name": name, "uri": f"s3://thaw/models/{name}",
             "autoscaling": {**demo["autoscaling"], "idle_grace_s": 600}}
        extra = dict(per_model.get(name, {}))
        m["autoscaling"] |= extra.pop("autoscaling", {})
        data["models"].append(m | extra)
    data["shapes"][0]["price_per_hour_usd"] = price
    data["pools"][0].update({"standby_min": 0, "standby_max": 0, "max_instances": max_instances, "pack": pack,
                             "budget_usd_per_hour": budget})
    return parse_config(data)


def ready(wid: str, model: str, **kw: Any) -> WorkerView:
    return WorkerView(wid, "cpu-local", WorkerState.READY, model, f"{model}-1", **kw)


def idle(since: float) -> ModelActivity:
    return ModelActivity(last_request_at=since)


WAITING = ModelActivity(queued=1, last_request_at=NOW)


def step(cfg: ThawConfig, workers: tuple[WorkerView, ...], activity: dict[str, ModelActivity],
         state: PolicyState | None = None, now: float = NOW, **snap: Any) -> tuple[list[Any], PolicyState]:
    decisions, out = decide(Snapshot(workers, activity, **snap), state or PolicyState(), cfg, now)
    return list(decisions), out


def evictions(decisions: list[Any]) -> list[tuple[str, str | None, str | None]]:
    return [(d.worker_id, d.model, d.for_model) for d in decisions if isinstance(d, Release) and d.reason == "evicted"]


def test_a_waiting_model_takes_the_idle_replica_of_another_in_a_full_pool() -> None:
    # One instance, a's replica idle for 300 s (kept 600 s): b's request releases it.
    ds, state = step(config("ab"), (ready("w1", "a"),), {"a": idle(NOW - 300), "b": WAITING})
    [ev] = [d for d in ds if isinstance(d, Release)]
    assert (ev.worker_id, ev.model, ev.reason, ev.for_model, ev.idle_s) == ("w1", "a", "evicted", "b", 300.0)
    assert not [d for d in ds if isinstance(d, Launch)]  # at max_instances: nothing to launch
    assert state.models["b"].at_capacity is None


def test_the_waiting_model_gets_the_released_instance_not_a_third() -> None:
    # Next tick: w1 drains; nothing more is evicted (it is on its way). Then it stands by
    # and b, waiting the longest, takes it although c (first in the config) now waits too.
    cfg = config("cab")
    _, state = step(cfg, (ready("w1", "a"),), {"a": idle(NOW - 300), "b": WAITING})
    ds, state = step(cfg, (WorkerView("w1", "cpu-local", WorkerState.DRAINING),), {"a": idle(NOW - 300), "b": WAITING},
                     state, NOW + 1)
    assert ds == [] and state.models["b"].at_capacity is None
    ds, state = step(cfg, (WorkerView("w1", "cpu-local", WorkerState.STANDBY),),
                     {"a": idle(NOW - 300), "b": WAITING, "c": ModelActivity(queued=1, last_request_at=NOW + 2)},
                     state, NOW + 2)
    assert [(d.worker_id, d.model) for d in ds if isinstance(d, Assign)] == [("w1", "b")]
    # Nothing idle left for c: refused once its grace (3 s) is over, not before.
    loading = (WorkerView("w1", "cpu-local", WorkerState.LOADING, "b", "b-1"),)
    activity = {"a": idle(NOW - 300), "b": WAITING, "c": ModelActivity(queued=1, last_request_at=NOW + 2)}
    assert state.models["c"].at_capacity is None
    _, state = step(cfg, loading, activity, state, NOW + 2 + GRACE - 0.5)
    assert state.models["c"].at_capacity is None
    _, state = step(cfg, loading, activity, state, NOW + 2 + GRACE)
    assert state.models["c"].at_capacity == FULL.format(1)


@pytest.mark.parametrize(("case", "a", "extra"), [
    ("in flight", ModelActivity(in_flight=1, last_request_at=NOW - 300), {}),
    ("queued behind its replica", ModelActivity(queued=1, last_request_at=NOW - 300), {}),
    ("min_replicas floor", idle(NOW - 300), {"a": {"autoscaling": {"min_replicas": 1}}}),
    # NOW is 02:46:40 UTC: a window opened at 02:00 for an hour holds a's replica.
    ("pre-warm window", idle(NOW - 300), {"a": {"prewarm": [{"cron": "0 * * * *", "for_s": 3600}]}}),
])
def test_a_replica_that_is_not_idle_or_is_held_is_never_taken(case: str, a: ModelActivity,
                                                                extra: dict[str, Any]) -> None:
    cfg = config("ab", **extra)
    ds, state = step(cfg, (ready("w1", "a"),), {"a": a, "b": WAITING})
    assert evictions(ds) == [], case
    assert not [d for d in ds if isinstance(d, Release)]
    # Nothing can be released: b is refused, by the cause, once its grace is over.
    ds, state = step(cfg, (ready("w1", "a"),), {"a": a, "b": WAITING}, state, NOW + GRACE)
    assert evictions(ds) == [] and state.models["b"].at_capacity == FULL.format(1)


def test_a_worker_lent_to_batch_is_taken_back_before_any_eviction() -> None:
    # w1 runs a's batch lines (a has no online traffic): a standby lent to batch, which
    # b's cold start takes back at once (warm_pool.policy.batch); c's idle replica stays.
    workers = (ready("w1", "a", batch=True), ready("w2", "c"))
    ds, state = step(config("abc", max_instances=2), workers, {"b": WAITING, "c": idle(NOW - 300)},
                     batch_demand={"a": 5})
    assert [(d.worker_id, d.model, d.tier) for d in ds if isinstance(d, Assign)] == [("w1", "b", "preempt")]
    assert evictions(ds) == [] and state.models["b"].at_capacity is None


def test_only_replicas_beyond_the_floor_are_taken() -> None:
    # a keeps one replica (min_replicas 1) and has two: the one beyond the floor goes.
    cfg = config("ab", max_instances=2, a={"autoscaling": {"min_replicas": 1, "max_replicas": 2}})
    ds, _ = step(cfg, (ready("w1", "a"), ready("w2", "a")), {"a": idle(NOW - 300), "b": WAITING})
    assert evictions(ds) == [("w1", "a", "b")]


def test_the_least_recently_used_model_is_evicted_first() -> None:
    # Three instances, three idle models: a last used 100 s ago, b 500 s, c 300 s.
    # d waits: b goes (the oldest use). d and e wait: b, then c.
    cfg = config("abcde", max_instances=3)
    workers = (ready("w1", "a"), ready("w2", "b"), ready("w3", "c"))
    activity = {"a": idle(NOW - 100), "b": idle(NOW - 500), "c": idle(NOW - 300), "d": WAITING}
    ds, _ = step(cfg, workers, activity)
    assert evictions(ds) == [("w2", "b", "d")]
    ds, _ = step(cfg, workers, activity | {"e": WAITING})
    assert evictions(ds) == [("w2", "b", "d"), ("w3", "c", "e")]
    assert [d.idle_s for d in ds if isinstance(d, Release)] == [500.0, 300.0]


def test_an_instance_released_this_tick_is_counted_before_any_eviction() -> None:
    # c was never used (its replica is held by nothing): released on its own this tick,
    # its instance goes to d; e's takes b's, the least recently used of the rest.
    cfg = config("abcde", max_instances=3)
    workers = (ready("w1", "a"), ready("w2", "b"), ready("w3", "c"))
    ds, _ = step(cfg, workers, {"a": idle(NOW - 100), "b": idle(NOW - 500), "d": WAITING, "e": WAITING})
    assert Release("w3", "c", "idle") in ds
    assert evictions(ds) == [("w2", "b", "e")]


def test_packed_room_comes_before_an_eviction() -> None:
    # The pool packs: b fits beside a's engine on w1, so a keeps its replica.
    cfg = config("ab", pack=True)
    workers = (ready("w1", "a", memory_bytes=3 * GiB, capacity_bytes=8 * GiB),)
    ds, state = step(cfg, workers, {"a": idle(NOW - 300), "b": WAITING}, engine_bytes={"a": 3 * GiB, "b": 3 * GiB})
    assert [d.model for d in ds if isinstance(d, Pack)] == ["b"] and evictions(ds) == []
    # No room left for it: a's instance is released for b instead.
    ds, _ = step(cfg, workers, {"a": idle(NOW - 300), "b": WAITING}, engine_bytes={"a": 3 * GiB, "b": 6 * GiB})
    assert evictions(ds) == [("w1", "a", "b")]


def test_a_pool_with_room_launches_whatever_its_budget() -> None:
    # Room under max_instances (2): b's launch goes ahead (a budget never holds serving
    # back), so nothing is evicted and b is not refused.
    cfg = config("ab", max_instances=2, price=1.0, budget=0.0)
    ds, state = step(cfg, (ready("w1", "a"),), {"a": idle(NOW - 300), "b": WAITING})
    assert Launch("cpu-local", "demand") in ds and evictions(ds) == []
    assert state.models["b"].at_capacity is None


def test_an_instance_booting_for_the_model_is_no_reason_to_refuse_it() -> None:
    # The pool is at max_instances with an instance still booting: b waits for it.
    workers = (ready("w1", "a"), WorkerView("w2", "cpu-local", WorkerState.LAUNCHING))
    ds, state = step(config("ab", max_instances=2), workers, {"a": ModelActivity(in_flight=1), "b": WAITING})
    assert ds == [] and state.models["b"].at_capacity is None


def test_capacity_is_set_told_to_activators_and_cleared() -> None:
    cfg = config("ab")
    workers = (ready("w1", "a"),)
    busy = {"a": ModelActivity(in_flight=1, last_request_at=NOW), "b": WAITING}
    # Within its grace (the activators' reports of a's request may lag) b only waits.
    _, state = step(cfg, workers, busy)
    assert state.models["b"].at_capacity is None and route_table(cfg, {}, {}, state, NOW)["b"].failure_kind is None
    t = NOW + GRACE
    _, state = step(cfg, workers, busy, state, t)
    assert state.models["b"].at_capacity == FULL.format(1)
    route = route_table(cfg, {}, {}, state, t)["b"]
    assert (route.failure_kind, route.error, route.failures, route.backoff_until) == (
        "capacity", FULL.format(1), 0, None)
    assert route_table(cfg, {}, {}, state, t)["a"].failure_kind is None
    # The condition holds while b waits and nothing changes.
    _, state = step(cfg, workers, busy, state, t + 1)
    assert state.models["b"].at_capacity == FULL.format(1)
    # Its requests refused, demand goes away: cleared.
    _, gone = step(cfg, workers, {"a": busy["a"], "b": ModelActivity(last_request_at=NOW)}, state, t + 2)
    assert gone.models["b"].at_capacity is None and route_table(cfg, {}, {}, gone, t + 2)["b"].failure_kind is None
    # Or a goes idle: its replica is taken for b, and the condition is cleared.
    ds, freed = step(cfg, workers, {"a": idle(t + 2), "b": WAITING}, state, t + 3)
    assert evictions(ds) == [("w1", "a", "b")] and freed.models["b"].at_capacity is None


def test_a_replica_that_reads_busy_within_the_grace_is_taken_once_it_reads_idle() -> None:
    # a's request ended just before b's arrived, but the last report still counts it:
    # b waits; on the next tick a reads idle and its replica is taken for b.
    cfg = config("ab")
    _, state = step(cfg, (ready("w1", "a"),), {"a": ModelActivity(in_flight=1, last_request_at=NOW), "b": WAITING})
    assert state.models["b"].at_capacity is None
    ds, state = step(cfg, (ready("w1", "a"),), {"a": idle(NOW), "b": WAITING}, state, NOW + 1)
    assert evictions(ds) == [("w1", "a", "b")] and state.models["b"].at_capacity is None


def with_adapter(cfg: ThawConfig, name: str, base: str, **autoscaling: Any) -> ThawConfig:
    """``cfg`` with ``name``, a LoRA adapter of ``base`` (its own ``autoscaling``)."""
    data = cfg.model_dump(mode="json")
    b = next(m for m in data["models"] if m["name"] == base)
    adapter = {k: v for k, v in b.items()
               if k not in ("shape", "max_context_tokens", "engine", "uri", "lora", "demo_if_missing")}
    adapter["autoscaling"] = {**adapter["autoscaling"], **autoscaling}
    data["models"].append(adapter | {"name": name, "served_name": name, "base": base,
                                     "adapter_uri": f"s3://thaw/adapters/{name}"})
    b["lora"] = {"max_loras": 2}
    return parse_config(data)


def test_an_adapters_floor_holds_its_bases_replica() -> None:
    # c, an adapter of a, keeps one replica (min_replicas 1): a's engine holds it.
    cfg = with_adapter(config("ab"), "c", "a", min_replicas=1)
    workers = (ready("w1", "a", adapters=(("c", "ready"),)),)
    ds, _ = step(cfg, workers, {"a": idle(NOW - 300), "b": WAITING})
    assert evictions(ds) == []
    # Without its floor, c is unloaded (a worker decided on is left for this tick), and
    # then a's engine goes like any idle replica.
    cfg = with_adapter(config("ab"), "c", "a")
    ds, state = step(cfg, workers, {"a": idle(NOW - 300), "b": WAITING})
    assert evictions(ds) == [] and [d.model for d in ds if type(d).__name__ == "UnloadAdapter"] == ["c"]
    unloading = (ready("w1", "a", adapters=(("c", "unloading"),)),)
    ds, _ = step(cfg, unloading, {"a": idle(NOW - 300), "b": WAITING}, state, NOW + 1)
    assert evictions(ds) == [("w1", "a", "b")]


def test_capacity_of_a_base_is_its_adapters_too() -> None:
    # c, a LoRA adapter of b, waits on b's engine: refused with it.
    cfg = with_adapter(config("ab"), "c", "b")
    state = PolicyState(models={"b": ModelState(at_capacity=FULL.format(1))})
    routes = route_table(cfg, {}, {}, state, NOW)
    assert (routes["c"].failure_kind, routes["c"].error) == ("capacity", FULL.format(1))


def test_a_failed_load_in_backoff_is_told_before_capacity() -> None:
    cfg = config("ab")
    state = PolicyState(models={"b": ModelState(failures=1, backoff_until=NOW + 10, last_error="boom",
                                                last_failure_kind="engine", at_capacity=FULL.format(1))})
    route = route_table(cfg, {}, {}, state, NOW)["b"]
    assert (route.failure_kind, route.error) == ("engine", "boom")


def test_an_evicted_model_is_let_go_until_its_next_request() -> None:
    # a's replica (kept 600 s, idle 300 s) is evicted for b. Its keep-alive bet was lost
    # to a request that was there: it is not put back on a standby that comes free
    # (where the next waiting model would evict it again, least recently used as it
    # still is), it is no launch the pool is asked for, and it is settled (a tick need
    # not judge it) until a request for it comes.
    full, grown = config("abc", max_instances=2), config("abc", max_instances=3)
    busy_c = ModelActivity(in_flight=1, last_request_at=NOW)
    ds, state = step(full, (ready("w1", "a"), ready("w2", "c")), {"a": idle(NOW - 300), "b": WAITING, "c": busy_c})
    assert evictions(ds) == [("w1", "a", "b")]
    drained = (WorkerView("w1", "cpu-local", WorkerState.STANDBY), ready("w2", "c"))
    ds, state = step(full, drained, {"a": idle(NOW - 300), "b": WAITING, "c": busy_c}, state, NOW + 1)
    assert [(d.worker_id, d.model) for d in ds if isinstance(d, Assign)] == [("w1", "b")]
    # The pool may grow by one (max_instances 3) and a standby registers: a does not take
    # it (beyond the standby band of 0, it is let go).
    workers = (ready("w1", "b"), ready("w2", "c"), WorkerView("w3", "cpu-local", WorkerState.STANDBY))
    activity = {"a": idle(NOW - 300), "b": idle(NOW + 2), "c": busy_c}
    ds, state = step(grown, workers, activity, state, NOW + 5)
    assert not [d for d in ds if isinstance(d, Assign | Launch)] and state.models["a"].unmet == 0
    assert settled(state.models["a"], grown.models[0], serving=0, demand=0, now=NOW + 5, shape_changed=False,
                   band_for=None)[0]
    # Its next request: a new bet. It takes the standby.
    ds, state = step(grown, workers, activity | {"a": ModelActivity(queued=1, last_request_at=NOW + 6)}, state,
                     NOW + 6)
    assert [(d.worker_id, d.model, d.reason) for d in ds if isinstance(d, Assign)] == [("w3", "a", "demand")]
    assert not state.models["a"].evicted


def test_a_model_that_keeps_a_replica_after_an_eviction_keeps_serving() -> None:
    # a has two replicas (one too many: a worker came back after a partition) and its
    # requests are short, so its last report shows nothing in flight: one replica is
    # evicted for b. a still serves on the other: its keep-alive is not lost, and a tick
    # whose report has no arrival for a (reports come once a second) does not release it.
    cfg = config("ab", max_instances=2, a={"autoscaling": {"max_replicas": 2}})
    between = ModelActivity(last_request_at=NOW - 0.03)  # nothing in flight right now
    ds, state = step(cfg, (ready("w1", "a"), ready("w2", "a")), {"a": between, "b": WAITING})
    assert evictions(ds) == [("w1", "a", "b")]
    assert not state.models["a"].evicted
    draining = (WorkerView("w1", "cpu-local", WorkerState.DRAINING), ready("w2", "a"))
    ds, state = step(cfg, draining, {"a": between, "b": WAITING}, state, NOW + 0.05)
    assert not [d for d in ds if isinstance(d, Release)], ds
