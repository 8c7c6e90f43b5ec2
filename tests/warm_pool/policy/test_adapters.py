"""LoRA adapters in the pool policy: an adapter's replicas are the engines of its base
that hold it; it is loaded into one with a free slot, unloaded on its own idle grace,
and with no engine of its base its traffic brings the base up."""

from __future__ import annotations

from pathlib import Path

import yaml

from thaw.config import ThawConfig, parse_config
from warm_pool.policy.decide import (
    ModelActivity,
    ModelState,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
)
from warm_pool.policy.decisions import Assign, LoadAdapter, Release, UnloadAdapter

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"


def config(max_loras: int = 2) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    demo = data["models"][0]
    demo["lora"] = {"max_loras": max_loras, "max_lora_rank": 8}
    demo["autoscaling"].update({"idle_grace_s": 300})
    for name in ("a1", "a2", "a3"):
        data["models"].append({"name": name, "base": "demo", "adapter_uri": f"s3://thaw/adapters/{name}",
                               "autoscaling": {"idle_grace_s": 30, "max_replicas": 2}})
    data["pools"][0].update({"standby_min": 1, "standby_max": 1, "max_instances": 4})
    return parse_config(data)


def base(wid: str, *adapters: tuple[str, str]) -> WorkerView:
    return WorkerView(wid, "cpu-local", "ready", "demo", f"demo-{wid}", adapters=tuple(adapters))  # type: ignore[arg-type]


STANDBY = WorkerView("w9", "cpu-local", "standby")  # type: ignore[arg-type]


def run(workers: tuple[WorkerView, ...], activity: dict[str, ModelActivity], state: PolicyState | None = None,
        now: float = 100.0, cfg: ThawConfig | None = None) -> tuple[list[object], PolicyState]:
    decisions, st = decide(Snapshot(workers, activity), state or PolicyState(), cfg or config(), now)
    return list(decisions), st


def test_an_adapter_request_loads_it_into_an_engine_of_its_base() -> None:
    ds, _ = run((base("w1"), STANDBY), {"a1": ModelActivity(queued=1, last_request_at=100.0),
                                        "demo": ModelActivity(in_flight=1, last_request_at=100.0)})
    assert [d for d in ds if isinstance(d, LoadAdapter)] == [LoadAdapter("w1", "a1", "demand")]
    # No standby is taken for it, and the base is not scaled for one queued request.
    assert not [d for d in ds if isinstance(d, Assign)]


def test_the_engine_with_the_fewest_adapters_takes_it_within_max_loras() -> None:
    ds, _ = run((base("w1", ("a2", "ready")), base("w2")),
                {"a1": ModelActivity(queued=1, last_request_at=100.0)})
    assert [d for d in ds if isinstance(d, LoadAdapter)] == [LoadAdapter("w2", "a1", "demand")]
    # Both engines full (max_loras 1): the adapter waits; its demand is its base's.
    full = (base("w1", ("a2", "ready")), base("w2", ("a3", "loading")))
    ds, _ = run(full, {"a1": ModelActivity(queued=1, last_request_at=100.0)}, cfg=config(max_loras=1))
    assert not [d for d in ds if isinstance(d, LoadAdapter)]


def test_with_no_engine_of_its_base_an_adapters_request_brings_the_base_up() -> None:
    ds, _ = run((STANDBY,), {"a1": ModelActivity(queued=1, last_request_at=100.0)})
    [a] = [d for d in ds if isinstance(d, Assign)]
    assert (a.worker_id, a.model) == ("w9", "demo")
    assert not [d for d in ds if isinstance(d, LoadAdapter)]


def test_an_idle_adapter_is_unloaded_while_its_base_serves_another() -> None:
    workers = (base("w1", ("a1", "ready"), ("a2", "ready")),)
    state = PolicyState()
    busy = {"a1": ModelActivity(in_flight=1, last_request_at=100.0),
            "a2": ModelActivity(in_flight=1, last_request_at=100.0)}
    _, state = run(workers, busy, state, now=100.0)
    # a1's last request ended at 101; a2 keeps serving.
    later = {"a1": ModelActivity(last_request_at=101.0), "a2": ModelActivity(in_flight=1, last_request_at=200.0)}
    ds, state = run(workers, later, state, now=102.0)
    assert not [d for d in ds if isinstance(d, UnloadAdapter)]
    ds, state = run(workers, later, state, now=200.0)
    assert [d for d in ds if isinstance(d, UnloadAdapter)] == [UnloadAdapter("w1", "a1", "idle")]
    # The base stays: its adapters' traffic is its own.
    assert not [d for d in ds if isinstance(d, Release)]


def test_a_failed_adapter_is_unloaded_and_backed_off_once() -> None:
    workers = (base("w1", ("a1", "failed")),)
    act = {"a1": ModelActivity(queued=1, last_request_at=100.0)}
    ds, state = run(workers, act)
    assert UnloadAdapter("w1", "a1", "failed") in ds
    ms: ModelState = state.models["a1"]
    assert ms.failures == 1 and ms.backoff_until > 100.0
    assert not [d for d in ds if isinstance(d, LoadAdapter)]  # backed off
    _, state = run(workers, act, state, now=100.5)
    assert state.models["a1"].failures == 1  # the same failure seen again counts once
