"""Pre-built standbys in the pool policy: placement by engine class (the swap tier)
and which standbys build which class (``plan_prebuilds``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from thaw.config import ThawConfig, parse_config
from thaw.wire import CachedWeights
from warm_pool.policy.decide import (
    ENGINE_BUILD_S,
    ModelActivity,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
    expected_start,
    kept_classes,
    plan_prebuilds,
)
from warm_pool.policy.decisions import Assign, Prebuild, Terminate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"
CLASS_A, CLASS_B = "a" * 16, "b" * 16


def config(prebuild: tuple[str, ...] = (), standby: int = 2) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    demo = data["models"][0]
    # A fine-tune of demo's base (class A) and a model of another class (B).
    data["models"] += [{**demo, "name": "tuned", "served_name": "tuned", "uri": "s3://thaw/models/tuned"},
                       {**demo, "name": "other", "served_name": "other", "uri": "s3://thaw/models/other"}]
    data["pools"][0].update({"standby_min": standby, "standby_max": standby, "max_instances": 6,
                             "prebuild": list(prebuild)})
    return parse_config(data)


CLASSES = {"demo": CLASS_A, "tuned": CLASS_A, "other": CLASS_B}


def w(i: int, cls: str | None = None, ready: bool = True, **cached: int) -> WorkerView:
    uri = "s3://thaw/models/tuned"
    return WorkerView(f"w{i}", "cpu-local", "standby", prebuilt_class=cls, prebuilt_ready=ready,
                      cached=tuple(CachedWeights(uri=uri, tier=t, bytes=n, total_bytes=100) for t, n in cached.items()))


def assigned(workers: tuple[WorkerView, ...], model: str = "tuned") -> Assign:
    snap = Snapshot(workers, {model: ModelActivity(queued=1, last_request_at=100.0)}, model_classes=CLASSES)
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    [a] = [d for d in decisions if isinstance(d, Assign)]
    return a


@pytest.mark.parametrize(("case", "workers", "model", "expected"), [
    # A built engine of the model's class beats a plain standby even with the weights in memory.
    ("swap beats a host copy", (w(1, host=100), w(2, CLASS_A)), "tuned", ("w2", "swap")),
    ("swap from its host copy is sooner still", (w(1, CLASS_A), w(2, CLASS_A, host=100)), "tuned", ("w2", "swap")),
    # Another class's engine must be stopped first: a plain standby is sooner.
    ("another class comes last", (w(1, CLASS_B), w(2)), "tuned", ("w2", "s3")),
    ("another class when nothing else", (w(1, CLASS_B),), "tuned", ("w1", "s3")),
    # Still building: no swap yet; as good as a plain standby (ties keep the id order).
    ("building is not a swap", (w(1, CLASS_A, ready=False), w(2)), "tuned", ("w1", "s3")),
    ("model of class B swaps into B", (w(1, CLASS_A), w(2, CLASS_B)), "other", ("w2", "swap")),
])
def test_placement_by_engine_class(case: str, workers: tuple[WorkerView, ...], model: str,
                                   expected: tuple[str, str]) -> None:
    a = assigned(workers, model)
    assert (a.worker_id, a.tier) == expected, case


def test_a_model_of_unknown_class_never_swaps() -> None:
    snap = Snapshot((w(1, CLASS_A),), {"tuned": ModelActivity(queued=1, last_request_at=100.0)}, model_classes={})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    [a] = [d for d in decisions if isinstance(d, Assign)]
    assert a.tier == "s3"


def test_expected_start_shows_its_arithmetic() -> None:
    uri = "s3://thaw/models/tuned"
    # 100 bytes from host memory at 8e9 B/s; a build adds ENGINE_BUILD_S.
    assert expected_start(w(1, CLASS_A, host=100), uri, 100, CLASS_A) == (100 / 8e9, "swap")
    assert expected_start(w(1, host=100), uri, 100, CLASS_A) == (100 / 8e9 + ENGINE_BUILD_S, "host")


def p(i: int, cls: str | None = None) -> WorkerView:
    return w(i, cls)


@pytest.mark.parametrize(("case", "standbys", "target", "colds", "expected"), [
    ("no cold starts yet: one each", [p(1), p(2), p(3)], 3, {},
     [Prebuild("w1", "demo", CLASS_A), Prebuild("w2", "other", CLASS_B)]),
    # A: 6 of 8 cold starts -> ceil(4 x 0.75) = 3; B: ceil(4 x 0.25) = 1.
    ("shares follow cold starts", [p(1), p(2), p(3), p(4)], 4, {CLASS_A: 6, CLASS_B: 2},
     [Prebuild("w1", "demo", CLASS_A), Prebuild("w2", "demo", CLASS_A), Prebuild("w3", "demo", CLASS_A),
      Prebuild("w4", "other", CLASS_B)]),
    # Models of no prebuilt class ("") keep their share as plain standbys: A ceil(4 x 1/4) = 1.
    ("others keep plain standbys", [p(1), p(2), p(3), p(4)], 4, {CLASS_A: 1, "": 3},
     [Prebuild("w1", "demo", CLASS_A), Prebuild("w2", "other", CLASS_B)]),
    ("built ones count", [p(1, CLASS_A), p(2), p(3, CLASS_B)], 3, {}, []),
    ("never more than there are", [p(1)], 4, {CLASS_A: 1, CLASS_B: 1}, [Prebuild("w1", "demo", CLASS_A)]),
])
def test_plan_prebuilds(case: str, standbys: list[WorkerView], target: int, colds: dict[str, int],
                        expected: list[Prebuild]) -> None:
    named = [("demo", CLASS_A), ("tuned", CLASS_A), ("other", CLASS_B)]
    assert plan_prebuilds(named, standbys, target=target, class_cold_starts=colds) == expected, case


def test_the_pool_stage_asks_standbys_to_prebuild_and_keeps_them_longest() -> None:
    cfg = config(prebuild=("tuned",), standby=1)
    snap = Snapshot((w(1), w(2)), {}, model_classes=CLASSES)
    decisions, _ = decide(snap, PolicyState(), cfg, now=100.0)
    # One standby too many: the newest goes (w2); the other builds class A.
    assert decisions == [Terminate("w2", "excess_standby"), Prebuild("w1", "tuned", CLASS_A)]
    # With w2 holding an engine, w1 (plain) is the one that goes.
    decisions, _ = decide(Snapshot((w(1), w(2, CLASS_A)), {}, model_classes=CLASSES), PolicyState(), cfg, now=100.0)
    assert decisions == [Terminate("w1", "excess_standby")]


def test_excess_goes_from_engines_of_classes_the_pool_does_not_prebuild() -> None:
    # One standby too many: by id the newest (w2) would go; it holds the class the pool
    # pre-builds (A), w1 a parked engine of B, which goes instead.
    cfg = config(prebuild=("tuned",), standby=1)
    decisions, _ = decide(Snapshot((w(1, CLASS_B), w(2, CLASS_A)), {}, model_classes=CLASSES), PolicyState(),
                          cfg, now=100.0)
    assert decisions == [Terminate("w1", "excess_standby")]


def test_without_prebuild_or_known_classes_nothing_is_prebuilt() -> None:
    snap = Snapshot((w(1), w(2)), {}, model_classes=CLASSES)
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert not any(isinstance(d, Prebuild) for d in decisions)
    decisions, _ = decide(Snapshot((w(1), w(2)), {}), PolicyState(), config(prebuild=("tuned",)), now=100.0)
    assert not any(isinstance(d, Prebuild) for d in decisions)




@pytest.mark.parametrize(("case", "prebuild", "classes", "expected"), [
    ("no prebuild: nothing kept", (), CLASSES, {}),
    # demo and tuned share class A, which the pool pre-builds; other (B) is not kept.
    ("the pre-built class's models", ("tuned",), CLASSES, {"demo": CLASS_A, "tuned": CLASS_A}),
    ("both classes", ("tuned", "other"), CLASSES, CLASSES),
    # The named model's class unknown: nothing is pre-built, nothing kept.
    ("class unknown", ("tuned",), {"demo": CLASS_A}, {}),
])
def test_kept_classes(case: str, prebuild: tuple[str, ...], classes: dict[str, str],
                      expected: dict[str, str]) -> None:
    assert kept_classes(config(prebuild=prebuild), classes) == expected, case
