"""The asleep tier (vLLM sleep mode): a ready engine put to sleep keeping its model,
and woken by the next assignment of that model instead of loading it again.

The worker is ``asleep`` at once (the pool manager routes nothing to it); the engine
drains, then sleeps. A wake waits for a sleep still going on; a release cancels both
(:meth:`SleepMode.cancel`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from thaw.log import get_logger
from thaw.wire import AssignRequest, FailureKind, LoadView, SleepRequest, WorkerState
from worker.engine_client import EngineClient, EngineError
from worker.engine_start import CurrentEngine
from worker.errors import Conflict
from worker.metrics import WorkerMetrics
from worker.state import Assignment, Facts

log = get_logger()

Drain = Callable[[EngineClient, float], Awaitable[None]]


class SleepAgent(Protocol):
    """What sleep and wake need from the agent."""

    metrics: WorkerMetrics

    @property
    def facts(self) -> Facts: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def launched(self) -> AssignRequest | None: ...
    def record(self, **changes: Any) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[Any]: ...
    def fail(self, reason: str, kind: FailureKind = "engine") -> None: ...


class SleepMode:
    def __init__(self, agent: SleepAgent, *, engine: CurrentEngine, drain: Drain, clock: Callable[[], float]) -> None:
        """``drain``: waits for the engine to finish its requests (``Releases.drain``)."""
        self._agent = agent
        self._engine = engine
        self._drain = drain
        self._clock = clock
        # Putting the engine to sleep, or waking it (one at a time: a wake waits for the sleep).
        self._sleep_task: asyncio.Task[Any] | None = None
        self._wake_task: asyncio.Task[Any] | None = None

    async def sleep(self, req: SleepRequest) -> bool:
        """Put the ready engine to sleep, keeping the model; False if it already is.
        Raises :class:`Conflict` unless it is ready (or asleep), of the current
        assignment, and was started with sleep mode."""
        agent = self._agent
        f, state = agent.facts, agent.state
        if f.assignment is None or state not in (WorkerState.READY, WorkerState.ASLEEP):
            raise Conflict(f"worker is {state.value}; only a ready engine can be put to sleep", state)
        if req.assignment_id is not None and req.assignment_id != f.assignment.assignment_id:
            raise Conflict(
                f"assignment {req.assignment_id!r} is not the current one ({f.assignment.assignment_id!r})",
                state,
            )
        if state is WorkerState.ASLEEP:
            return False
        if agent.launched is None or not agent.launched.sleep_mode:
            raise Conflict("the engine was not started with sleep mode (sleep_mode in the assignment)", state)
        log.info("sleep", assignment_id=f.assignment.assignment_id, level=req.level)
        agent.record(sleep_requested_at=self._clock())
        self._sleep_task = agent.spawn(self._run_sleep(req), name="sleep")
        return True

    async def _run_sleep(self, req: SleepRequest) -> None:
        engine = self._engine.client
        if engine is None:
            return
        await self._drain(engine, req.drain_timeout_s)
        t0 = self._clock()
        try:
            await engine.sleep(req.level)
        except EngineError as exc:
            self._agent.fail(f"putting the engine to sleep failed: {exc}")
            return
        self._agent.metrics.sleep_seconds.observe(self._clock() - t0)
        log.info("engine_asleep", level=req.level, seconds=round(self._clock() - t0, 3))

    def wake(self, req: AssignRequest) -> None:
        """An assignment for the model asleep here: wake the engine instead of loading.
        Raises :class:`Conflict` for another model or other engine settings."""
        agent = self._agent
        launched, cur = agent.launched, agent.facts.assignment
        assert launched is not None and cur is not None
        same = (req.model, req.uri, req.served_model_name, req.max_model_len, req.engine) == (
            launched.model, launched.uri, launched.served_model_name, launched.max_model_len, launched.engine)
        if not same:
            raise Conflict(f"worker is asleep with model {cur.model!r} ({cur.uri}); release it before "
                           f"assigning another model or other engine settings", agent.state)
        a = Assignment(req.assignment_id, req.model, req.uri, req.served_model_name, self._clock(),
                       revision=req.revision)
        agent.record(assignment=a, sleep_requested_at=None, snapshot_restored_at=None, snapshot=None,
                     launched_at=None, weights_loaded_at=None, engine_ready_at=None, woken_at=None,
                     failure=None, failure_kind=None, load=LoadView(tier="asleep"))
        log.info("assignment_accepted", assignment_id=a.assignment_id, model=a.model, uri=a.uri, wake=True)
        self._wake_task = agent.spawn(self._run_wake(a), name="wake")

    async def _run_wake(self, a: Assignment) -> None:
        agent = self._agent
        sleeping = self._sleep_task
        if sleeping is not None:
            await asyncio.gather(sleeping, return_exceptions=True)  # still going to sleep
        engine = self._engine.client
        if agent.facts.failure is not None or agent.facts.assignment != a:
            return
        if engine is None:
            agent.fail("the engine went away while asleep")
            return
        try:
            await engine.wake_up()
        except EngineError as exc:
            if agent.facts.assignment == a:
                agent.fail(f"waking the engine failed: {exc}")
            return
        if agent.facts.assignment != a:
            return  # released meanwhile
        now = self._clock()
        agent.record(engine_ready_at=now, woken_at=now)
        agent.metrics.engine_start.observe(now - a.assigned_at)
        log.info("engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine.url,
                 total_s=round(now - a.assigned_at, 3), woken=True)

    async def cancel(self) -> None:
        """Cancel a sleep or wake still going on (a release), and wait until it ends."""
        for task in (self._sleep_task, self._wake_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def forget(self) -> None:
        """The assignment is gone: nothing of it is asleep or waking."""
        self._sleep_task = self._wake_task = None
