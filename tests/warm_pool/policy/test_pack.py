"""Several engines on one worker in the pool policy (``pools[].pack``): a model goes
into the free room of a worker already serving before it takes a standby, only when
its engine fits; a worker hosting packed engines is neither a standby nor billed twice."""

from __future__ import annotations

from pathlib import Path

import yaml

from thaw.config import ThawConfig, parse_config
from thaw.units import GiB
from warm_pool.policy.decide import (
    ModelActivity,
    PolicyState,
    Snapshot,
    WorkerView,
    decide,
    pack_room,
    place_packed,
)
from warm_pool.policy.decisions import Assign, Launch, Pack, Release, Terminate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "thaw.yaml"
CAP = 8 * GiB


def config(*, pack: bool = True, standby: int = 0, max_instances: int = 4) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    demo = data["models"][0]
    data["models"] += [{**demo, "name": "tuned", "served_name": "tuned", "uri": "s3://thaw/models/tuned"},
                       {**demo, "name": "other", "served_name": "other", "uri": "s3://thaw/models/other"}]
    data["pools"][0].update({"standby_min": standby, "standby_max": standby, "max_instances": max_instances,
                             "pack": pack})
    return parse_config(data)


def serving(wid: str, model: str, held: int, state: str = "ready", cap: int = CAP) -> WorkerView:
    return WorkerView(wid, "cpu-local", state, model, f"{model}-1", memory_bytes=held, capacity_bytes=cap)  # type: ignore[arg-type]


def packed(wid: str, host: str, model: str, held: int, state: str = "ready") -> WorkerView:
    return WorkerView(wid, "cpu-local", state, model, f"{model}-2", host=host, memory_bytes=held)  # type: ignore[arg-type]


def standby(wid: str, cap: int = CAP) -> WorkerView:
    return WorkerView(wid, "cpu-local", "standby", capacity_bytes=cap)  # type: ignore[arg-type]


def decide_for(workers: tuple[WorkerView, ...], model: str = "tuned", need: int = 3 * GiB,
               cfg: ThawConfig | None = None) -> list[object]:
    snap = Snapshot(workers, {model: ModelActivity(queued=1, last_request_at=100.0)},
                    engine_bytes={"demo": 3 * GiB, "tuned": need, "other": need})
    decisions, _ = decide(snap, PolicyState(), cfg or config(), now=100.0)
    return list(decisions)


def test_a_model_goes_into_free_room_before_it_takes_a_standby() -> None:
    ds = decide_for((serving("w1", "demo", 3 * GiB), standby("w2")))
    [p] = [d for d in ds if isinstance(d, Pack)]
    assert (p.worker_id, p.model, p.memory_bytes, p.tier) == ("w1", "tuned", 3 * GiB, "packed")
    assert p.engine_id == f"w1.{p.assignment_id}"
    assert not [d for d in ds if isinstance(d, Assign)]


def test_a_model_that_does_not_fit_takes_a_standby() -> None:
    ds = decide_for((serving("w1", "demo", 3 * GiB), standby("w2")), need=6 * GiB)
    assert not [d for d in ds if isinstance(d, Pack)]
    [a] = [d for d in ds if isinstance(d, Assign)]
    assert a.worker_id == "w2"


def test_no_room_and_no_standby_launches() -> None:
    ds = decide_for((serving("w1", "demo", 3 * GiB), packed("w1.x", "w1", "other", 3 * GiB)))
    assert not [d for d in ds if isinstance(d, Pack)]
    assert [d for d in ds if isinstance(d, Launch) and d.reason == "demand"]


def test_a_model_of_unknown_size_is_never_packed() -> None:
    snap = Snapshot((serving("w1", "demo", 3 * GiB), standby("w2")),
                    {"tuned": ModelActivity(queued=1, last_request_at=100.0)}, engine_bytes={})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert not [d for d in decisions if isinstance(d, Pack)]


def test_a_pool_that_does_not_pack_takes_a_standby() -> None:
    ds = decide_for((serving("w1", "demo", 3 * GiB), standby("w2")), cfg=config(pack=False))
    assert not [d for d in ds if isinstance(d, Pack)]
    assert [d for d in ds if isinstance(d, Assign) and d.worker_id == "w2"]


def test_best_fit_keeps_the_larger_room_for_larger_models() -> None:
    workers = (serving("w1", "demo", 1 * GiB), serving("w2", "other", 4 * GiB))
    room = pack_room(workers)
    assert room == {"w1": 7 * GiB, "w2": 4 * GiB}
    shape_of = {"w1": "cpu-local", "w2": "cpu-local"}
    assert place_packed(room, shape_of, "cpu-local", 3 * GiB) == "w2"
    assert place_packed(room, shape_of, "cpu-local", 5 * GiB) == "w1"
    assert place_packed(room, shape_of, "cpu-local", 8 * GiB) is None
    assert place_packed(room, shape_of, "gpu-big", 1 * GiB) is None


def test_room_counts_every_engine_on_the_worker_loading_ones_too() -> None:
    workers = (serving("w1", "demo", 2 * GiB), packed("w1.a", "w1", "tuned", 2 * GiB, state="loading"),
               packed("w1.b", "w1", "other", 1 * GiB, state="draining"))
    assert pack_room(workers) == {"w1": 3 * GiB}


def test_one_tick_packs_two_models_without_overfilling() -> None:
    snap = Snapshot((serving("w1", "demo", 2 * GiB),),
                    {"tuned": ModelActivity(queued=1, last_request_at=100.0),
                     "other": ModelActivity(queued=1, last_request_at=100.0)},
                    engine_bytes={"demo": 2 * GiB, "tuned": 3 * GiB, "other": 3 * GiB})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert len([d for d in decisions if isinstance(d, Pack)]) == 2  # 2 + 3 + 3 = 8 GiB: exactly full
    snap = Snapshot(snap.workers, snap.activity, engine_bytes={"demo": 2 * GiB, "tuned": 3 * GiB, "other": 4 * GiB})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert len([d for d in decisions if isinstance(d, Pack)]) == 1


def test_a_standby_whose_own_engine_went_keeps_its_packed_engines() -> None:
    """Its own model was released: it hosts a packed engine still. It is neither a free
    standby for a whole model nor an excess standby to terminate, and it takes the next
    packed engine."""
    workers = (standby("w1"), packed("w1.a", "w1", "demo", 3 * GiB))
    ds = decide_for(workers, need=3 * GiB, cfg=config(standby=0))
    assert not [d for d in ds if isinstance(d, Terminate | Assign)]
    [p] = [d for d in ds if isinstance(d, Pack)]
    assert p.worker_id == "w1"


def test_a_worker_with_packed_engines_counts_once() -> None:
    """Budgets and max_instances count instances: a worker and its packed engines are one."""
    cfg = config(standby=1, max_instances=2)
    workers = (serving("w1", "demo", 3 * GiB), packed("w1.a", "w1", "tuned", 3 * GiB))
    snap = Snapshot(workers, {"demo": ModelActivity(in_flight=1, last_request_at=100.0),
                              "tuned": ModelActivity(in_flight=1, last_request_at=100.0)},
                    engine_bytes={"demo": 3 * GiB, "tuned": 3 * GiB})
    decisions, state = decide(snap, PolicyState(), cfg, now=100.0)
    # One instance exists: the standby target of 1 launches one, within max_instances 2.
    assert [d for d in decisions if isinstance(d, Launch)] == [Launch("cpu-local", "standby")]
    assert state.pools["cpu-local"].grant is not None


def test_a_failed_packed_engine_is_released_alone() -> None:
    workers = (serving("w1", "demo", 3 * GiB), packed("w1.a", "w1", "tuned", 3 * GiB, state="failed"))
    snap = Snapshot(workers, {"demo": ModelActivity(in_flight=1, last_request_at=100.0)},
                    engine_bytes={"demo": 3 * GiB, "tuned": 3 * GiB})
    decisions, _ = decide(snap, PolicyState(), config(), now=100.0)
    assert [d for d in decisions if isinstance(d, Release)] == [Release("w1.a", "tuned", "failed")]


def test_nothing_is_packed_beside_an_engine_of_unknown_memory() -> None:
    ds = decide_for((serving("w1", "demo", 0), standby("w2")))
    assert not [d for d in ds if isinstance(d, Pack)]
    assert [d for d in ds if isinstance(d, Assign) and d.worker_id == "w2"]
