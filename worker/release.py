"""Releasing an assignment: drain the engine (``/metrics``: nothing running or waiting,
twice in a row), then park it when it is a kept engine (``worker.kept``), else stop the
engine host's process group and start a fresh engine host for the next model.

A release of a failed assignment only clears it (its engine host is already being
replaced); one while loading aborts the load. A packed engine's release stops its one
engine host for good: the engine goes away with its assignment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from thaw.log import get_logger
from thaw.wire import ReleaseRequest, WorkerState
from worker.drain import drain
from worker.engine_client import EngineClient
from worker.engine_start import CurrentEngine
from worker.errors import Conflict
from worker.kept import KeptEngines
from worker.settings import AgentSettings
from worker.state import Facts
from worker.supervisor import HostSupervisor

log = get_logger()


class ReleaseAgent(Protocol):
    """What a release needs from the agent."""

    settings: AgentSettings
    on_released: Callable[[], None] | None

    @property
    def facts(self) -> Facts: ...
    @property
    def state(self) -> WorkerState: ...
    def record(self, **changes: Any) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]: ...
    async def scan_caches(self) -> list[Any]: ...
    async def stop_work(self) -> None: ...
    def clear_assignment(self) -> None: ...


class Releases:
    def __init__(self, agent: ReleaseAgent, *, supervisor: HostSupervisor, engine: CurrentEngine,
                 kept: KeptEngines, clock: Callable[[], float]) -> None:
        self._agent = agent
        self._supervisor = supervisor
        self._engine = engine
        self._kept = kept
        self._clock = clock

    async def drain(self, engine: EngineClient, timeout_s: float) -> None:
        """Wait for the engine to finish its requests (``worker.drain``), recording how
        many are in flight, until ``timeout_s`` or until its engine host is gone (a
        release drains first; so does a sleep)."""
        def gone() -> bool:
            host = self._supervisor.host
            return host is None or host.returncode is not None

        await drain(engine, timeout_s, poll_s=self._agent.settings.drain_poll_s, clock=self._clock,
                    on_in_flight=lambda n: self._agent.record(in_flight=n), engine_gone=gone)

    async def release(self, req: ReleaseRequest) -> bool:
        """Start releasing the current assignment; False when there was nothing to do.

        Raises :class:`Conflict` for an ``assignment_id`` that is not the current one.
        """
        agent = self._agent
        f = agent.facts
        if f.assignment is None:
            if f.failure is not None:  # an engine host failed while standing by
                agent.record(failure=None, failure_kind=None)
                return True
            return False
        if req.assignment_id is not None and req.assignment_id != f.assignment.assignment_id:
            raise Conflict(
                f"assignment {req.assignment_id!r} is not the current one ({f.assignment.assignment_id!r})",
                agent.state,
            )
        if f.release_requested_at is not None:
            return True  # already releasing
        if f.failure is not None:
            # The failed engine host is already being replaced (if it was launched).
            log.info("release", assignment_id=f.assignment.assignment_id, from_state="failed")
            if agent.settings.packed:
                agent.record(release_requested_at=self._clock())
                agent.spawn(self.run(False, 0.0), name="release")
                return True
            agent.clear_assignment()
            return True
        drain = agent.state is WorkerState.READY  # else loading: abort
        log.info("release", assignment_id=f.assignment.assignment_id, from_state=agent.state.value,
                 drain_timeout_s=req.drain_timeout_s)
        agent.record(release_requested_at=self._clock())
        agent.spawn(self.run(drain, req.drain_timeout_s), name="release")
        return True

    async def run(self, drain: bool, drain_timeout_s: float) -> None:
        """Carry out a release recorded already (``release_requested_at``)."""
        agent = self._agent
        await agent.stop_work()
        engine = self._engine.client
        if drain and engine is not None:
            await self.drain(engine, drain_timeout_s)
        if agent.settings.packed:
            # A packed engine goes away with its assignment: no engine host follows.
            await self._engine.close()
            await self._supervisor.close(graceful=drain)
            agent.clear_assignment()
            if agent.on_released is not None:
                agent.on_released()
            return
        if drain and await self._kept.park():
            # The engine stays, parked, for the next model of its class.
            await agent.scan_caches()
            agent.clear_assignment()
            return
        await self._engine.close()
        host = self._supervisor.host
        if host is None or host.launched:
            await self._supervisor.replace(graceful=drain)
        # Before standby is reported: the controller places the next model by it.
        await agent.scan_caches()
        agent.clear_assignment()
