"""Scheduled pre-warm: windows open and close on the cron, and decide() holds replicas
through them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from thaw.config import ConfigError, Prewarm, parse_config
from warm_pool.policy.decide import ModelActivity, PolicyState, Snapshot, WorkerView, decide
from warm_pool.policy.decisions import Assign, Release
from warm_pool.policy.prewarm import next_edge, scheduled_replicas

NINE = datetime(2026, 12, 3, 9, 0, tzinfo=UTC).timestamp()  # a Thursday
GPU = {"gpu_type": "l40s-48gb", "gpu_count": 1, "gpu_memory_gib": 48, "host_memory_gib": 64}


def config(prewarm: list[dict[str, Any]], **autoscaling: Any) -> Any:
    return parse_config({
        "controller": {"url": "http://controller.internal:8100"},
        "shapes": [{"name": "gpu", **GPU, "price_per_hour_usd": 2.0}],
        "pools": [{"shape": "gpu", "standby_min": 1, "standby_max": 4, "max_instances": 10}],
        "models": [{"name": "m0", "uri": "s3://thaw/m0", "shape": "gpu", "prewarm": prewarm,
                    "autoscaling": {"idle_grace_s": 60, "max_replicas": 3, **autoscaling}}],
    })


def w(i: int, state: str, model: str | None = None) -> WorkerView:
    return WorkerView(f"w{i:02d}", "gpu", state, model, f"{model}-{i}" if model else None)  # type: ignore[arg-type]


WINDOWS = [Prewarm(cron="0 9 * * 1-5", replicas=2, for_s=3600), Prewarm(cron="30 9 * * *", for_s=600)]


@pytest.mark.parametrize(("at", "held"), [
    (NINE - 1, 0),
    (NINE, 2),                # the weekday window opens
    (NINE + 1800, 2),         # both open: the larger
    (NINE + 2399, 2),
    (NINE + 3599, 2),
    (NINE + 3600, 0),         # closed (the 09:30 one closed at 09:40)
    (NINE + 2 * 86400, 0),    # Saturday 09:00: only the daily one, not open yet
    (NINE + 2 * 86400 + 1800, 1),
])
def test_scheduled_replicas(at: float, held: int) -> None:
    assert scheduled_replicas(WINDOWS, at) == held


def test_next_edge_walks_every_opening_and_closing() -> None:
    edges, t = [], NINE - 1
    while (t := next_edge(WINDOWS, t)) is not None and t < NINE + 86400:  # type: ignore[assignment]
        edges.append(t - NINE)
    assert edges == [0, 1800, 2400, 3600]


def test_a_window_brings_a_replica_before_its_first_request_and_lets_it_go_after() -> None:
    cfg = config([{"cron": "0 9 * * *", "for_s": 1800}])
    state = PolicyState()
    none: dict[str, ModelActivity] = {}
    # 08:59: nothing scheduled, nothing asked.
    decisions, state = decide(Snapshot((w(1, "standby"),), none), state, cfg, NINE - 60)
    assert not any(isinstance(d, Assign) for d in decisions)
    # 09:00, with no request yet: a standby is assigned, as a pre-warm.
    decisions, state = decide(Snapshot((w(1, "standby"),), none), state, cfg, NINE)
    assert [(d.model, d.reason) for d in decisions if isinstance(d, Assign)] == [("m0", "prewarm")]
    # Held through the window though idle ...
    decisions, state = decide(Snapshot((w(1, "ready", "m0"), w(2, "standby")), none), state, cfg, NINE + 1799)
    assert not any(isinstance(d, Release) for d in decisions)
    # ... and let go when it closes (no request came: nothing keeps it).
    decisions, state = decide(Snapshot((w(1, "ready", "m0"), w(2, "standby")), none), state, cfg, NINE + 1800)
    assert Release("w01", "m0", "idle") in decisions


def test_a_window_asks_no_more_than_max_replicas() -> None:
    cfg = config([{"cron": "0 9 * * *", "replicas": 5, "for_s": 600}])
    decisions, _ = decide(Snapshot(tuple(w(i, "standby") for i in range(6)), {}), PolicyState(), cfg, NINE)
    assert len([d for d in decisions if isinstance(d, Assign)]) == 3


@pytest.mark.parametrize(("prewarm", "says"), [
    ([{"cron": "0 9 * *", "for_s": 60}], "5 fields"),
    ([{"cron": "0 25 * * *", "for_s": 60}], "hour: '25' is outside 0-23"),
    ([{"cron": "0 9 * * *", "for_s": 0}], "for_s"),
    ([{"cron": "0 9 * * *", "for_s": 8 * 86400}], "for_s"),
    ([{"cron": "0 9 * * *", "for_s": 60, "replicas": 0}], "replicas"),
    ([{"cron": "0 9 * * *"}], "for_s"),
])
def test_a_bad_window_is_refused_naming_what_is_wrong(prewarm: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(prewarm)
    assert "prewarm" in str(err.value) and says in str(err.value)


def test_an_adapter_takes_its_bases_schedule() -> None:
    data = config([]).model_dump()
    data["models"].append({"name": "ad", "base": "m0", "uri": "s3://thaw/ad", "adapter_uri": "s3://thaw/ad",
                           "shape": "gpu", "prewarm": [{"cron": "0 9 * * *", "for_s": 60}]})
    with pytest.raises(ConfigError, match="prewarm schedule of its own"):
        parse_config(data)
