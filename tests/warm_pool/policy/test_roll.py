"""The policy's part in run-time model changes: a roll replaces the replicas of an older
revision with current ones, releasing each old one only once a current one is ready to
take its traffic; a removed model's replicas and adapters go."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from thaw.config import ThawConfig, parse_config
from warm_pool.policy.decide import ModelActivity, PolicyState, Snapshot, WorkerView, decide
from warm_pool.policy.decisions import Assign, Release, UnloadAdapter

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"
BUSY = {"demo": ModelActivity(in_flight=2, last_request_at=100.0)}


def config(**autoscaling: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["models"][0]["autoscaling"].update({"idle_grace_s": 60, "max_replicas": 3, "target_concurrency": 4,
                                             **autoscaling})
    data["pools"][0].update({"standby_min": 1, "standby_max": 2, "max_instances": 6})
    return parse_config(data)


def worker(i: int, state: str = "ready", revision: int | None = 1, model: str = "demo") -> WorkerView:
    return WorkerView(f"w{i}", "cpu-local", state, model, f"{model}-{i}", revision=revision)  # type: ignore[arg-type]


def model_decisions(decisions: list[Any]) -> list[Any]:
    return [d for d in decisions if isinstance(d, Assign | Release | UnloadAdapter)]


def step(workers: tuple[WorkerView, ...], outdated: frozenset[int] = frozenset({1}), **kw: Any) -> list[Any]:
    snap = Snapshot(workers, BUSY, outdated={"demo": outdated})
    decisions, _ = decide(snap, PolicyState(), config(**kw), now=100.0)
    return model_decisions(decisions)


def test_a_roll_brings_a_current_replica_up_before_the_old_one_goes() -> None:
    # One old replica serving: a standby is assigned the current revision; the old one stays.
    assert step((worker(1), worker(2, "standby", None))) == [Assign("w2", "demo", "demo-1", "roll")]
    # The current one loading: nothing more (it counts), the old one still serves.
    assert step((worker(1), worker(2, "loading", 2))) == []
    # The current one ready: the old one is released (drained by its worker).
    assert step((worker(1), worker(2, "ready", 2))) == [Release("w1", "demo", "rolled")]


def test_several_replicas_are_replaced_one_ready_replica_at_a_time() -> None:
    old = (worker(1), worker(2))
    standbys = (worker(3, "standby", None), worker(4, "standby", None))
    # In flight 2 at target 4 with a floor of two: two replicas wanted, two current ones placed.
    got = step(old + standbys, min_replicas=2)
    assert sorted(d.worker_id for d in got if isinstance(d, Assign)) == ["w3", "w4"]
    assert not [d for d in got if isinstance(d, Release)]
    # One current ready: one old one goes, the other serves until the second is ready.
    got = step(old + (worker(3, "ready", 2), worker(4, "loading", 2)), min_replicas=2)
    assert got == [Release("w1", "demo", "rolled")]
    got = step((worker(2), worker(3, "ready", 2), worker(4, "ready", 2)), min_replicas=2)
    assert got == [Release("w2", "demo", "rolled")]


def test_an_old_replica_still_loading_goes_at_once_and_a_settings_only_change_rolls_nothing() -> None:
    got = step((worker(1, "loading"), worker(2, "standby", None)))
    assert Release("w1", "demo", "rolled") in got and Assign("w2", "demo", "demo-1", "roll") in got
    # Revision 1 is not outdated (e.g. revision 2 changed only autoscaling): nothing rolls.
    assert step((worker(1),), outdated=frozenset()) == []
    # Unknown revision (a replica from before the registry): never rolled.
    assert step((worker(1, revision=None),)) == []


def test_a_removed_model_is_released_and_its_adapters_unloaded() -> None:
    gone = replace(worker(1, model="old"), adapters=(("old-tuned", "ready"),))
    base = replace(worker(2), adapters=(("removed-adapter", "ready"), ("demo-x", "loading")))
    snap = Snapshot((gone, base, worker(3, "loading", model="old")), {})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    got = model_decisions(decisions)
    assert Release("w1", "old", "removed") in got and Release("w3", "old", "removed") in got
    assert UnloadAdapter("w2", "removed-adapter", "removed") in got
    assert UnloadAdapter("w1", "old-tuned", "removed") in got
