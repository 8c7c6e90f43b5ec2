"""The controller's tick judges only the models whose decision can change
(``warm_pool.judging``), and decides exactly as judging every model would."""

from __future__ import annotations

from collections.abc import Collection

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.controller
from simulator.sim import Simulator
from tests.simulator.support import config, costs, equivalence_cfg, trace
from thaw.config import ThawConfig
from warm_pool.judging import Judging
from warm_pool.policy.decide import ModelActivity, PolicyState, Snapshot, WorkerView, decide
from warm_pool.policy.decisions import Assign, Decision, Release


class Selective:
    """``decide`` as the controller's tick calls it: on the models ``Judging`` selects."""

    def __init__(self) -> None:
        self.judging = Judging()
        self.judged = 0
        self.ticks = 0

    def __call__(self, snap: Snapshot, state: PolicyState, cfg: ThawConfig, now: float, *,
                 only: Collection[str] | None = None, pools: bool = True) -> tuple[list[Decision], PolicyState]:
        assert only is None and pools  # the simulator's exact mode: every model, every tick
        names = self.judging.select(snap, cfg, now)
        decisions, new = decide(snap, state, cfg, now, only=names, pools=pools)
        self.judging.judged(names, snap, new, decisions, now)
        self.judged += self.judging.last_judged
        self.ticks += 1
        return decisions, new


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.integers(0, 12),
       arrivals=st.lists(st.tuples(st.floats(0, 400, allow_nan=False), st.integers(0, 3), st.integers(1, 4000),
                                   st.integers(1, 400)), min_size=1, max_size=60))
def test_judging_only_what_changed_decides_as_judging_every_model(
        variant: int, arrivals: list[tuple[float, int, int, int]]) -> None:
    # The simulator's exact mode hands decide() the whole fleet every tick, as the
    # controller does; with the controller's selection the decisions are the same on
    # every config the simulator's own fast mode is checked on (the asleep tier, the
    # histogram keep-alive, min_replicas, pre-built and packed engines, adapters,
    # scheduled pre-warm windows, by the time of day).
    cfg = equivalence_cfg(variant)
    tr = trace([(round(t, 3), f"m{m}", i, o) for t, m, i, o in arrivals])
    c = costs(cfg, load_s=7, prefill=2000, tpot_s=0.05, release_s=2)
    every = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
    selective = Selective()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulator.controller, "decide", selective)
        chosen = Simulator(cfg, c, tr, exact=True, record_decisions=True).run()
    assert chosen.decisions == every.decisions
    assert chosen.summary == every.summary
    assert selective.judged < selective.ticks * len(cfg.models)


def test_a_long_tail_at_rest_is_not_judged() -> None:
    # 1,000 models at zero, nothing asked: after the first tick no model is judged;
    # one request judges its model; its replica's views judge it until it settles.
    cfg = config(1000, standby_min=2, standby_max=2, max_instances=4)
    workers = (WorkerView("w0", "gpu", "standby"), WorkerView("w1", "gpu", "standby"))
    judging, state = Judging(), PolicyState()

    def tick(now: float, snap: Snapshot) -> list[Decision]:
        """The tick's decisions for models (the pool's launches, which these snapshots
        never show arriving, left out)."""
        nonlocal state
        names = judging.select(snap, cfg, now)
        decisions, state = decide(snap, state, cfg, now, only=names)
        judging.judged(names, snap, state, decisions, now)
        return [d for d in decisions if getattr(d, "model", None) is not None]

    assert tick(0.0, Snapshot(workers)) == [] and judging.last_judged == 1000
    assert tick(1.0, Snapshot(workers)) == [] and judging.last_judged == 0
    asked = {"m7": ModelActivity(queued=1, last_request_at=1.5)}
    decisions = tick(2.0, Snapshot(workers, asked))
    assert [(type(d), d.model) for d in decisions] == [(Assign, "m7")]
    assert judging.last_judged == 1
    loading = (WorkerView("w0", "gpu", "loading", model="m7", assignment_id="a"), workers[1])
    assert tick(3.0, Snapshot(loading, asked)) == []
    assert judging.last_judged == 1
    ready = (WorkerView("w0", "gpu", "ready", model="m7", assignment_id="a"), workers[1])
    served = {"m7": ModelActivity(in_flight=1, last_request_at=1.5)}
    assert tick(4.0, Snapshot(ready, served)) == []
    done = {"m7": ModelActivity(last_request_at=4.5)}
    assert tick(5.0, Snapshot(ready, done)) == []
    for t in range(6, 20):
        assert tick(float(t), Snapshot(ready, done)) == []
    assert judging.last_judged == 0  # idle within its grace: nothing to judge


def test_the_end_of_a_keep_alive_judges_the_model_again() -> None:
    # Idle with nothing changing, the model is judged again when its grace ends (and
    # its replica released then, on the tick judging every model would release it), not
    # on every tick before.
    cfg = config(50, idle_grace_s=30, standby_min=1, standby_max=1, max_instances=4)
    ready = (WorkerView("w0", "gpu", "ready", model="m3", assignment_id="a"), WorkerView("w1", "gpu", "standby"))
    done = {"m3": ModelActivity(last_request_at=0.5)}

    def released(judging: Judging | None) -> tuple[int | None, list[int]]:
        state, judged = PolicyState(), []
        for t in range(0, 60):
            snap = Snapshot(ready, done)
            names = judging.select(snap, cfg, float(t)) if judging else None
            decisions, state = decide(snap, state, cfg, float(t), only=names)
            if judging:
                judging.judged(names, snap, state, decisions, float(t))
                judged.append(judging.last_judged)
            if any(isinstance(d, Release) and d.model == "m3" for d in decisions):
                return t, judged
        return None, judged

    every, _ = released(None)
    chosen, judged = released(Judging())
    assert every is not None and chosen == every
    assert sum(judged[2:-1]) == 0  # nothing judged while the window held


def test_a_changed_model_entry_is_judged_and_a_changed_pool_judges_all() -> None:
    cfg = config(20)
    judging = Judging()
    snap = Snapshot((WorkerView("w0", "gpu", "standby"),))
    assert judging.select(snap, cfg, 0.0) is None
    judging.judged(None, snap, decide(snap, PolicyState(), cfg, 0.0)[1], [], 0.0)
    assert judging.select(snap, cfg, 1.0) == set()
    data = cfg.model_dump()
    data["models"][4]["autoscaling"]["max_replicas"] = 2
    assert judging.select(snap, ThawConfig.model_validate(data), 2.0) == {"m4"}
    data["pools"][0]["standby_max"] = data["pools"][0]["standby_max"] + 1
    assert judging.select(snap, ThawConfig.model_validate(data), 3.0) is None


def test_a_model_with_batch_lines_waiting_is_judged_when_a_standby_frees_up() -> None:
    # bulk's lines wait (its batch demand unchanged) while solo holds the only worker;
    # when solo's replica is released the standby goes to bulk's batch work.
    cfg = config(3, standby_min=0, standby_max=0, max_instances=1)
    judging, state = Judging(), PolicyState()
    lines = {"m1": 40}

    def tick(now: float, workers: tuple[WorkerView, ...]) -> list[Decision]:
        nonlocal state
        snap = Snapshot(workers, batch_demand=lines)
        names = judging.select(snap, cfg, now)
        decisions, state = decide(snap, state, cfg, now, only=names)
        judging.judged(names, snap, state, decisions, now)
        return decisions

    busy = (WorkerView("w0", "gpu", "ready", model="m0", assignment_id="a"),)
    tick(0.0, busy)
    tick(1.0, busy)
    freed = (WorkerView("w0", "gpu", "standby"),)
    assert [(type(d), d.model, d.batch) for d in tick(2.0, freed) if isinstance(d, Assign)] == [(Assign, "m1", True)]
