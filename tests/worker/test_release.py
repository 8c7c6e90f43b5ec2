"""Releases (``worker.release``) driven through their protocol, with the fakes' engine
host and engine: a ready engine drains, then is parked when kept or its host replaced;
one loading is stopped at once; a failed assignment is cleared; a packed engine goes
with its release; a drain ends when the engine host is gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.waiting import until
from tests.worker.fakes import FakeHost, World
from tests.worker.parts import FakeAgent, FakeSupervisor, assignment, engine, host, settings
from thaw.wire import ReleaseRequest, WorkerState
from worker.engine_start import CurrentEngine
from worker.errors import Conflict
from worker.release import Releases


class Kept:
    """The kept engines, as a release sees them: a park that keeps the engine or not."""

    def __init__(self) -> None:
        self.keeps = False
        self.parks = 0

    async def park(self) -> bool:
        self.parks += 1
        return self.keeps


@dataclass
class Releasing:
    releases: Releases
    agent: FakeAgent
    supervisor: FakeSupervisor
    host: FakeHost
    engine: CurrentEngine
    kept: Kept
    world: World


@pytest.fixture
async def releasing(tmp_path: Path) -> AsyncIterator[Releasing]:
    world, s = World(), settings(tmp_path)
    agent = FakeAgent(s)
    h = host(world)
    h.launched = True
    sup, kept, current = FakeSupervisor(h), Kept(), engine(world, s)
    current.at(8123)
    releases = Releases(agent, supervisor=sup, engine=current, kept=kept, clock=time.time)  # type: ignore[arg-type]
    yield Releasing(releases, agent, sup, h, current, kept, world)
    await agent.close()


def ready(r: Releasing) -> None:
    r.agent.record(assignment=assignment(), launched_at=101.0, engine_ready_at=102.0)


async def test_nothing_to_release_or_a_failure_standing_by_cleared(releasing: Releasing) -> None:
    assert not await releasing.releases.release(ReleaseRequest())
    releasing.agent.record(failure="engine host exited with status 1 while standing by")
    assert await releasing.releases.release(ReleaseRequest())
    assert releasing.agent.facts.failure is None and releasing.agent.state is WorkerState.STANDBY


async def test_a_release_of_another_assignment_is_refused(releasing: Releasing) -> None:
    ready(releasing)
    with pytest.raises(Conflict, match="assignment 'a0' is not the current one") as exc:
        await releasing.releases.release(ReleaseRequest(assignment_id="a0"))
    assert exc.value.state is WorkerState.READY and releasing.agent.facts.release_requested_at is None


async def test_a_ready_engine_drains_then_its_host_is_replaced(releasing: Releasing) -> None:
    ready(releasing)
    releasing.world.in_flight = [2, 1, 0, 0]
    assert await releasing.releases.release(ReleaseRequest(drain_timeout_s=5.0))
    assert releasing.agent.state is WorkerState.DRAINING
    assert await releasing.releases.release(ReleaseRequest())  # already releasing
    await until("the assignment cleared", lambda: releasing.agent.cleared)
    r = releasing
    # Drained (two zeros in a row), not kept, so stopped gracefully and a fresh host next.
    assert (r.agent.work_stopped, r.kept.parks, r.supervisor.replaced, r.agent.scans) == (1, 1, [True], 1)
    assert r.world.in_flight == [0] and (r.engine.client, r.engine.url) == (None, None)
    assert r.agent.state is WorkerState.STANDBY


async def test_a_kept_engine_is_parked_not_stopped(releasing: Releasing) -> None:
    ready(releasing)
    releasing.kept.keeps = True
    await releasing.releases.release(ReleaseRequest())
    await until("the assignment cleared", lambda: releasing.agent.cleared)
    assert releasing.supervisor.replaced == [] and releasing.engine.client is not None
    assert releasing.agent.scans == 1  # before standby is reported


async def test_a_release_while_loading_stops_the_engine_at_once(releasing: Releasing) -> None:
    releasing.agent.record(assignment=assignment(), launched_at=101.0)
    releasing.world.in_flight = [5]
    await releasing.releases.release(ReleaseRequest(drain_timeout_s=60.0))
    await until("the assignment cleared", lambda: releasing.agent.cleared)
    # Nothing to drain or park: the load is cut, no grace.
    assert (releasing.kept.parks, releasing.supervisor.replaced) == (0, [False])
    assert releasing.agent.facts.in_flight is None


async def test_a_failed_assignment_is_cleared_at_once(releasing: Releasing) -> None:
    releasing.agent.record(assignment=assignment(), failure="engine exited with status 1 while loading")
    assert await releasing.releases.release(ReleaseRequest())
    # Its engine host is already being replaced: nothing else to do.
    assert (releasing.agent.cleared, releasing.agent.work_stopped, releasing.supervisor.replaced) == (1, 0, [])


async def test_a_packed_engine_goes_with_its_release(releasing: Releasing) -> None:
    releasing.agent.settings = replace(releasing.agent.settings, host_worker_id="w0")  # packed beside w0
    released: list[bool] = []
    releasing.agent.on_released = lambda: released.append(True)
    ready(releasing)
    await releasing.releases.release(ReleaseRequest())
    await until("the release done", lambda: released)
    # Its one engine host closed for good: none replaces it.
    assert (releasing.supervisor.closed, releasing.supervisor.replaced, releasing.kept.parks) == ([True], [], 0)
    assert releasing.agent.cleared == 1 and releasing.engine.client is None


async def test_a_drain_ends_when_the_engine_host_is_gone(releasing: Releasing) -> None:
    releasing.world.in_flight = [3]
    releasing.host.exit(-9)
    client = releasing.engine.client
    assert client is not None
    await asyncio.wait_for(releasing.releases.drain(client, 60.0), 5.0)
    assert releasing.agent.facts.in_flight == 3  # its one reading
