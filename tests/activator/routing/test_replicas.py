"""One model's replicas: taken from route tables, their slots, ejection and batch room."""

from __future__ import annotations

from typing import Any

from activator.routing.replicas import ModelReplicas, Replica, cold_start_tier
from thaw.wire import ModelRoute, ReplicaRoute


def route(i: int, **kw: Any) -> ReplicaRoute:
    return ReplicaRoute(worker_id=f"w{i}", url=f"http://127.0.0.1:{i}", served_model_name="demo",
                        assignment_id=f"a-{i}", **kw)


def entry(*replicas: ReplicaRoute, **kw: Any) -> ModelRoute:
    return ModelRoute(served_name="demo", replicas=list(replicas), **kw)


def test_cold_start_tier_says_where_the_replica_got_its_model() -> None:
    def rep(**kw: Any) -> Replica:
        return Replica("w1", "http://x", "m", "a1", {"woken": kw.pop("woken", None)}, **kw)

    assert cold_start_tier(100.0, rep(load_tier="host", worker_started_at=50.0)) == "host"
    assert cold_start_tier(100.0, rep(load_tier="disk", worker_started_at=50.0)) == "disk"
    assert cold_start_tier(100.0, rep(load_tier="s3")) == "s3"
    assert cold_start_tier(100.0, rep()) == "s3"  # a loader that reports nothing read the store
    # The worker's agent started after the request began waiting: launched for it.
    assert cold_start_tier(100.0, rep(load_tier="s3", worker_started_at=101.0)) == "launch"
    assert cold_start_tier(100.0, rep(woken=120.0, load_tier="asleep")) == "asleep"
    # Weights swapped into an engine built before, from wherever they were read.
    assert cold_start_tier(100.0, rep(load_tier="host", load_swap=True, worker_started_at=50.0)) == "swap"
    assert cold_start_tier(100.0, rep(load_tier="s3", load_swap=True)) == "swap"
    # An engine packed beside others: its worker was serving, so never a launch.
    assert cold_start_tier(100.0, rep(load_tier="s3", packed=True, worker_started_at=101.0)) == "packed"
    # An adapter into a base serving before the request; a base brought up for it counts
    # where the base came from.
    assert cold_start_tier(100.0, rep(adapter=True, base_ready_at=90.0, load_tier="host")) == "adapter"
    assert cold_start_tier(100.0, rep(adapter=True, base_ready_at=110.0, load_tier="host",
                                      worker_started_at=50.0)) == "host"


def test_a_table_keeps_the_counts_of_replicas_it_still_lists_and_tells_who_came_and_went() -> None:
    seen: list[tuple[bool, str, str, float]] = []
    reps = ModelReplicas("demo", lambda *a: seen.append(a))
    reps.take(entry(route(1)), now=10.0)
    first = reps.reserve(cap=4)
    assert first is not None and first.outstanding == 1
    reps.take(entry(route(1), route(2)), now=11.0)
    assert {r.url: r.outstanding for r in reps.usable} == {route(1).url: 1, route(2).url: 0}
    # Listed again for another assignment: a new replica, no requests of its own.
    reps.take(entry(route(1).model_copy(update={"assignment_id": "a-9"}), route(2)), now=12.0)
    assert {r.url: r.outstanding for r in reps.usable} == {route(1).url: 0, route(2).url: 0}
    reps.take(entry(route(2)), now=13.0)
    assert seen == [(True, "a-1", "demo", 10.0), (True, "a-2", "demo", 11.0),
                    (True, "a-9", "demo", 12.0), (False, "a-1", "demo", 12.0), (False, "a-9", "demo", 13.0)]


def test_a_slot_freed_on_an_old_replica_is_freed_on_the_one_a_new_table_made() -> None:
    reps = ModelReplicas("demo")
    reps.take(entry(route(1)), now=0.0)
    got = reps.reserve(cap=4)
    assert got is not None
    reps.take(entry(route(1)), now=1.0)  # a new table while the request runs
    [live] = reps.usable
    assert live is not got and live.outstanding == 1
    reps.release(got)
    assert (got.outstanding, live.outstanding) == (0, 0)
    reps.release(got)  # never below zero
    assert live.outstanding == 0


def test_reserve_takes_a_slot_below_the_cap_and_none_when_all_are_full() -> None:
    reps = ModelReplicas("demo")
    reps.take(entry(route(1), route(2)), now=0.0)
    taken = [reps.reserve(cap=2) for _ in range(4)]
    assert all(r is not None for r in taken)
    assert sorted(r.outstanding for r in reps.usable) == [2, 2]  # 2 replicas x 2 slots
    assert reps.reserve(cap=2) is None


def test_an_ejected_replica_is_unusable_until_its_own_ejection_ends() -> None:
    reps = ModelReplicas("demo")
    reps.take(entry(route(1), route(2)), now=0.0)
    url = route(1).url
    reps.eject(url, until=10.0, now=0.0)
    assert [r.url for r in reps.usable] == [route(2).url]
    assert len(reps.listed) == 2
    # The tables still list it: still ejected until 10.
    reps.take(entry(route(1), route(2)), now=5.0)
    assert [r.url for r in reps.usable] == [route(2).url]
    # Ejected again until 20: the first ejection's end does not readmit it.
    reps.eject(url, until=20.0, now=6.0)
    reps.readmit(url, until=10.0, now=10.0)
    assert [r.url for r in reps.usable] == [route(2).url]
    reps.readmit(url, until=20.0, now=20.0)
    assert {r.url for r in reps.usable} == {route(1).url, route(2).url}


def test_state_and_backoff_follow_the_table() -> None:
    reps = ModelReplicas("demo")
    assert reps.state(now=0.0) == "cold"
    assert reps.take(entry(loading=1), now=0.0) is False
    assert reps.state(now=0.0) == "loading"
    # A new failure, with a backoff until 30.
    assert reps.take(entry(failures=1, error="boom", failure_kind="memory", backoff_until=30.0), now=1.0)
    assert (reps.state(now=1.0), reps.failure_kind, reps.backing_off(1.0)) == ("failed", "memory", True)
    assert reps.take(entry(failures=1, error="boom", backoff_until=30.0), now=2.0) is False  # not new
    assert reps.state(now=31.0) == "cold" and not reps.backing_off(31.0)
    reps.take(entry(route(1)), now=32.0)
    assert reps.state(now=32.0) == "ready"


def test_batch_room_is_a_share_of_the_slots_within_the_free_ones() -> None:
    reps = ModelReplicas("demo")
    reps.take(entry(route(1), route(2)), now=0.0)
    # 0.5 x (4 + 4) = 4 allowed, less the 1 running.
    assert reps.batch_room(cap=4, share=0.5, running=1) == 3
    # A replica placed for batch lends all its slots: 4 + 0.5 x 4 = 6.
    reps.take(entry(route(1, batch=True), route(2)), now=1.0)
    assert reps.batch_room(cap=4, share=0.5, running=0) == 6
    # Within the free ones: 8 slots, 7 taken.
    for _ in range(7):
        reps.reserve(cap=4)
    assert reps.batch_room(cap=4, share=1.0, running=0) == 1


def test_serves_other_says_a_worker_was_taken_for_another_assignment() -> None:
    reps = ModelReplicas("demo")
    reps.take(entry(route(1)), now=0.0)
    lent = reps.usable[0]
    assert not reps.serves_other(lent)
    reps.take(entry(route(1).model_copy(update={"assignment_id": "a-other"})), now=1.0)
    assert reps.serves_other(lent)
