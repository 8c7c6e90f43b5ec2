"""The asleep tier (``worker.sleep``) driven through its protocol, with the fakes'
engine: a ready engine of the current assignment, started with sleep mode, drains then
sleeps; the same model wakes it (after a sleep still going on), another is refused; a
failed sleep or wake fails the assignment; a release cancels both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import until
from tests.worker.fakes import World
from tests.worker.parts import FakeAgent, assign_request, assignment, engine, settings
from thaw.wire import SleepRequest, WorkerState
from worker.engine_client import EngineClient
from worker.engine_start import CurrentEngine
from worker.errors import Conflict
from worker.sleep import SleepMode


@dataclass
class Sleeping:
    mode: SleepMode
    agent: FakeAgent
    engine: CurrentEngine
    world: World
    # Drains asked for (their timeouts); each waits for the gate.
    drains: list[float]
    gate: asyncio.Event


@pytest.fixture
async def sleeping(tmp_path: Path) -> AsyncIterator[Sleeping]:
    world, s = World(), settings(tmp_path)
    agent = FakeAgent(s)
    agent.record(assignment=assignment(), launched_at=101.0, engine_ready_at=102.0)
    agent.launched = assign_request(sleep_mode=True)
    current = engine(world, s)
    current.at(8123)
    drains: list[float] = []
    gate = asyncio.Event()
    gate.set()

    async def drain(_engine: EngineClient, timeout_s: float) -> None:
        drains.append(timeout_s)
        await gate.wait()

    yield Sleeping(SleepMode(agent, engine=current, drain=drain, clock=time.time), agent, current, world, drains,
                   gate)
    await agent.close()


async def test_a_ready_engine_drains_then_sleeps(sleeping: Sleeping) -> None:
    assert await sleeping.mode.sleep(SleepRequest(level=1, drain_timeout_s=3.0))
    assert sleeping.agent.state is WorkerState.ASLEEP  # at once: nothing is routed to it
    await until("the engine asleep", lambda: sleeping.world.asleep)
    assert (sleeping.drains, sleeping.world.sleeps) == ([3.0], [1])
    assert not await sleeping.mode.sleep(SleepRequest())  # asleep already


@pytest.mark.parametrize(("case", "facts", "body", "sleep_mode", "match"), [
    ("loading", {"engine_ready_at": None}, {}, True, "worker is loading; only a ready engine"),
    ("another assignment", {}, {"assignment_id": "a0"}, True, "assignment 'a0' is not the current one"),
    ("no sleep mode", {}, {}, False, "not started with sleep mode"),
])
async def test_sleep_is_refused_unless_the_engine_can_sleep(sleeping: Sleeping, case: str, facts: dict[str, Any],
                                                            body: dict[str, Any], sleep_mode: bool,
                                                            match: str) -> None:
    sleeping.agent.record(**facts)
    sleeping.agent.launched = assign_request(sleep_mode=sleep_mode)
    with pytest.raises(Conflict, match=match):
        await sleeping.mode.sleep(SleepRequest(**body))
    assert sleeping.agent.facts.sleep_requested_at is None and sleeping.drains == []


async def test_a_failed_sleep_fails_the_assignment(sleeping: Sleeping) -> None:
    sleeping.world.sleep_error = "the engine answered 500"
    await sleeping.mode.sleep(SleepRequest())
    await until("the failure", lambda: sleeping.agent.failures)
    assert sleeping.agent.failures == [("putting the engine to sleep failed: the engine answered 500", "engine")]


async def test_the_same_model_wakes_the_engine_after_the_sleep_going_on(sleeping: Sleeping) -> None:
    sleeping.gate.clear()  # still draining when the next assignment comes
    await sleeping.mode.sleep(SleepRequest())
    sleeping.mode.wake(assign_request("a2", sleep_mode=True))
    f = sleeping.agent.facts
    assert f.assignment is not None and f.assignment.assignment_id == "a2"
    assert f.load is not None and f.load.tier == "asleep" and sleeping.agent.state is WorkerState.LOADING
    sleeping.gate.set()
    await until("the engine woken", lambda: sleeping.agent.facts.woken_at)
    # It slept first, then woke: awake now, ready again.
    assert (sleeping.world.sleeps, sleeping.world.wakes, sleeping.world.asleep) == ([1], 1, False)
    assert sleeping.agent.state is WorkerState.READY


async def test_another_model_or_other_settings_are_refused_while_asleep(sleeping: Sleeping) -> None:
    await sleeping.mode.sleep(SleepRequest())
    for req in (assign_request("a2", model="other"), assign_request("a2", max_model_len=1024)):
        with pytest.raises(Conflict, match="worker is asleep with model 'demo'"):
            sleeping.mode.wake(req)
    assert sleeping.agent.facts.assignment == assignment() and sleeping.world.wakes == 0


async def test_a_failed_wake_or_an_engine_gone_fails_the_assignment(sleeping: Sleeping) -> None:
    await sleeping.mode.sleep(SleepRequest())
    await until("the engine asleep", lambda: sleeping.world.asleep)
    sleeping.world.wake_error = "CUDA error"
    sleeping.mode.wake(assign_request("a2", sleep_mode=True))
    await until("the failure", lambda: sleeping.agent.failures)
    assert sleeping.agent.failures == [("waking the engine failed: CUDA error", "engine")]


async def test_an_engine_gone_while_asleep_fails_the_wake(sleeping: Sleeping) -> None:
    await sleeping.mode.sleep(SleepRequest())
    await sleeping.engine.close()
    sleeping.mode.wake(assign_request("a2", sleep_mode=True))
    await until("the failure", lambda: sleeping.agent.failures)
    assert sleeping.agent.failures == [("the engine went away while asleep", "engine")]


async def test_cancel_ends_a_sleep_going_on(sleeping: Sleeping) -> None:
    sleeping.gate.clear()
    await sleeping.mode.sleep(SleepRequest())
    await until("the drain", lambda: sleeping.drains)
    await sleeping.mode.cancel()
    sleeping.gate.set()
    assert sleeping.world.sleeps == []  # cancelled while draining: never slept
