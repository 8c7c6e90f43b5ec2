"""Batch work in the pool policy, stepped by hand: standbys lent to batch, taken back by
an online cold start, never a reason to launch (but within batch.max_usd_per_hour)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from thaw.config import ThawConfig, parse_config
from warm_pool.policy.batch import batch_launches, lent_to_batch
from warm_pool.policy.decide import ModelActivity, PolicyState, Snapshot, WorkerView, decide
from warm_pool.policy.decisions import Assign, Launch, Release, Terminate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"


def config(standby: int = 1, max_instances: int = 3, **batch: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    base = data["models"][0]
    base["autoscaling"].update({"idle_grace_s": 60, "max_replicas": 3, "target_concurrency": 4})
    data["models"].append({**base, "name": "bulk", "served_name": "bulk-chat", "uri": "s3://thaw/models/bulk"})
    data["pools"][0].update({"standby_min": standby, "standby_max": standby, "max_instances": max_instances})
    data["shapes"][0]["price_per_hour_usd"] = 2.0
    data["pools"][0]["budget_usd_per_hour"] = None  # the standby band is the pool's bound here
    data["batch"] = batch
    return parse_config(data)


def standby(i: int) -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", "standby")


def on_batch(i: int, model: str = "bulk", state: str = "ready", since: float = 0.0) -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", state, model, f"{model}-{i}", since=since, batch=True)  # type: ignore[arg-type]


def test_batch_work_takes_a_free_standby_and_launches_nothing() -> None:
    snap = Snapshot((standby(1),), batch_demand={"bulk": 40})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert decisions == [Assign("w1", "bulk", "bulk-1", "batch", batch=True)]
    # Lent to batch, it is still the pool's standby: nothing is launched to replace it.
    snap = Snapshot((on_batch(1, state="loading"),), batch_demand={"bulk": 40})
    assert decide(snap, PolicyState(), config(), now=101.0)[0] == []


def test_without_a_free_standby_batch_waits() -> None:
    snap = Snapshot((WorkerView("w1", "cpu-local", "ready", "demo", "demo-1"),),
                    {"demo": ModelActivity(in_flight=1, last_request_at=100.0)}, batch_demand={"bulk": 5})
    decisions, _ = decide(snap, PolicyState(), config(standby=0), now=100.0)
    assert decisions == []


def test_online_demand_takes_the_standby_first() -> None:
    snap = Snapshot((standby(1),), {"demo": ModelActivity(queued=1, last_request_at=100.0)},
                    batch_demand={"bulk": 40})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert decisions == [Assign("w1", "demo", "demo-1"), Launch("cpu-local", "standby")]


def test_an_online_cold_start_takes_back_a_standby_lent_to_batch() -> None:
    snap = Snapshot((on_batch(1, since=50.0), on_batch(2, since=60.0)),
                    {"demo": ModelActivity(queued=1, last_request_at=100.0)}, batch_demand={"bulk": 40})
    decisions, _ = decide(snap, PolicyState(), config(standby=2), now=100.0)
    # The one that started serving batch last goes (the least batch work lost), as a
    # standby would; the pool then launches a standby in its place.
    assert decisions == [Assign("w2", "demo", "demo-1", "demand", "preempt"), Launch("cpu-local", "standby")]
    # One still loading goes before either (no batch work lost at all).
    snap = Snapshot((on_batch(1, since=50.0), on_batch(2, state="loading", since=40.0)),
                    {"demo": ModelActivity(queued=1, last_request_at=100.0)}, batch_demand={"bulk": 40})
    assert decide(snap, PolicyState(), config(standby=2), now=100.0)[0][0].worker_id == "w2"


def test_a_batch_replica_that_online_traffic_uses_is_a_replica_like_any() -> None:
    w = on_batch(1)
    busy = {"bulk": ModelActivity(in_flight=2, last_request_at=100.0)}
    assert not lent_to_batch(w, busy) and lent_to_batch(w, {})
    # Online demand for another model does not take it while its own model is busy.
    snap = Snapshot((w,), {**busy, "demo": ModelActivity(queued=1, last_request_at=100.0)},
                    batch_demand={"bulk": 40})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert not [d for d in decisions if isinstance(d, Assign)]
    assert Launch("cpu-local", "demand") in decisions


def test_a_batch_replica_stays_while_lines_wait_and_goes_when_they_are_done() -> None:
    snap = Snapshot((on_batch(1),), batch_demand={"bulk": 3})
    assert decide(snap, PolicyState(), config(), now=1000.0)[0] == []
    snap = Snapshot((on_batch(1),), batch_demand={})
    decisions, _ = decide(snap, PolicyState(), config(), now=1000.0)
    assert decisions == [Release("w1", "bulk", "idle")]


def test_a_lent_standby_is_never_terminated_as_excess() -> None:
    # Standby band 1: a free standby and one lent to batch are two; the free one goes.
    snap = Snapshot((standby(3), on_batch(1)), batch_demand={"bulk": 3})
    decisions, _ = decide(snap, PolicyState(), config(), now=1000.0)
    assert decisions == [Terminate("w3", "excess_standby")]


def test_batch_spend_buys_instances_beyond_the_band() -> None:
    cfg = config(standby=1, max_instances=4, max_usd_per_hour=0.0)
    snap = Snapshot((on_batch(1),), batch_demand={"bulk": 3, "demo": 2})
    # No batch spend: demo's lines wait for a standby.
    assert decide(snap, PolicyState(), cfg, now=1000.0)[0] == []
    price = cfg.shapes[0].price_per_hour_usd
    cfg = config(standby=1, max_instances=4, max_usd_per_hour=price * 1.5)
    decisions, _ = decide(snap, PolicyState(), cfg, now=1000.0)
    assert decisions == [Launch("cpu-local", "batch")]
    # It stands by: demo's lines take it, and it is not excess while they wait.
    snap = Snapshot((on_batch(1), standby(2)), batch_demand={"bulk": 3, "demo": 2})
    decisions, _ = decide(snap, PolicyState(), cfg, now=1001.0)
    assert decisions == [Assign("w2", "demo", "demo-1", "batch", batch=True)]
    # Batches done: both released, then the one beyond the band goes.
    snap = Snapshot((standby(1), standby(2)), batch_demand={})
    assert decide(snap, PolicyState(), cfg, now=1100.0)[0] == [Terminate("w2", "excess_standby")]


def test_batch_launches_spend_within_the_cap_in_pool_order() -> None:
    cfg = config(max_usd_per_hour=0.0)
    assert batch_launches(cfg, {"cpu-local": 3}) == {}
    price = cfg.shapes[0].price_per_hour_usd
    assert batch_launches(config(max_usd_per_hour=2 * price), {"cpu-local": 3}) == {"cpu-local": 2}
    assert batch_launches(config(max_usd_per_hour=10 * price), {"cpu-local": 3}) == {"cpu-local": 3}
