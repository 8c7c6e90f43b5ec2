"""The cold queue (arrival order, all woken or failed at once) and the fair queue
(round-robin across tenants)."""

from __future__ import annotations

import asyncio

import pytest

from activator.routing.queues import ColdQueue, FairQueue
from activator.routing.replicas import Replica
from tests.waiting import until


async def test_the_cold_queue_wakes_all_in_arrival_order() -> None:
    q, woken = ColdQueue(), []

    async def wait(i: int) -> None:
        await q.wait(5.0)
        woken.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await until("three waiting", lambda: len(q) == 3, 2)
    q.release_all()
    await asyncio.gather(*tasks)
    assert woken == [0, 1, 2] and len(q) == 0


async def test_the_cold_queue_fails_all_at_once_and_a_timeout_leaves_it() -> None:
    q = ColdQueue()
    with pytest.raises(TimeoutError):
        await q.wait(0.01)
    assert len(q) == 0
    tasks = [asyncio.create_task(q.wait(5.0)) for _ in range(2)]
    await asyncio.sleep(0)
    q.fail_all(RuntimeError("load failed"))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [str(r) for r in results] == ["load failed", "load failed"] and len(q) == 0


def rep(i: int) -> Replica:
    return Replica(f"w{i}", f"http://r{i}", "demo", f"a-{i}", {})


async def test_the_fair_queue_hands_slots_round_robin_across_tenants() -> None:
    q = FairQueue()
    # Tenant a queued three, then b one: b need not wait behind all of a's.
    futs = [(t, q.join(t, key=f"{t}{i}")) for t, i in (("a", 0), ("a", 1), ("a", 2), ("b", 0))]
    assert len(q) == 4
    slots = [rep(i) for i in range(3)]
    asked: list[str | None] = []

    def reserve(key: str | None) -> Replica | None:
        asked.append(key)
        return slots.pop(0) if slots else None

    q.dispatch(reserve)
    served = [t for t, f in futs if f.done()]
    assert served == ["a", "a", "b"]  # a, then b, then a again; the third slot was the last
    assert asked == ["a0", "b0", "a1", "a2"]  # each asked with its prefix key; a2 found none
    assert len(q) == 1


async def test_the_fair_queue_skips_the_gone_and_fails_all() -> None:
    q = FairQueue()
    gone = q.join("a", None)
    gone.cancel()  # timed out or the client left
    waiting = q.join("b", None)
    q.dispatch(lambda key: rep(1))
    assert waiting.result().url == "http://r1"
    left = [q.join("c", None), q.join("d", None)]
    q.fail_all(LookupError("removed"))
    assert all(isinstance(f.exception(), LookupError) for f in left) and len(q) == 0
