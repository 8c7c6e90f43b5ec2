"""wait_event: a loop built on it ends when cancelled, even when the cancellation lands
in the same loop turn as the event (asyncio.wait_for on 3.11 swallows that one: a
controller's loop did, and its shutdown hung in CI)."""

from __future__ import annotations

import asyncio

import pytest

from thaw.aio import wait_event


async def _loop(ev: asyncio.Event, turns: list[int]) -> None:
    while True:
        await wait_event(ev, 10.0)
        ev.clear()
        turns.append(1)


async def test_a_cancel_in_the_same_turn_as_the_event_ends_the_loop() -> None:
    ev, turns = asyncio.Event(), []
    task = asyncio.create_task(_loop(ev, turns))
    for _ in range(3):
        await asyncio.sleep(0)  # not a poll: turns of the event loop
    ev.set()
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert task in done and task.cancelled()


async def test_it_says_whether_the_event_was_set() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.01) is False
    ev.set()
    assert await wait_event(ev, 10.0) is True


@pytest.mark.parametrize("delay", [0, 1, 2])
async def test_a_cancel_while_waiting_propagates(delay: int) -> None:
    ev = asyncio.Event()
    task = asyncio.create_task(wait_event(ev, 10.0))
    for _ in range(delay):
        await asyncio.sleep(0)  # not a poll: turns of the event loop
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
