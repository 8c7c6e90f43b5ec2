"""Packed engines: several engines on one worker (``pools[].pack``).

A worker that packs runs, beside its own engine, engines the controller packs into its
free room (``POST /engines``). Each packed engine is an :class:`~worker.agent.Agent` of
its own, in this process: its own engine host (a process group, so a crash of one
engine leaves its neighbours serving), its own facts and state, its own heartbeat under
its own worker id, and its own control API under this worker's
(``/engines/{id}/...``). It lives for one assignment: its release stops its engine
host and removes it.

The fit is checked here, where what the engines hold is known: the new engine's
``memory_bytes`` (the controller's ``thaw.fit.engine_memory``) beside what this
worker's engine and its packed engines hold must stay within ``capacity_bytes``
(``thaw.fit.engine_capacity``); a refusal names both numbers.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from thaw.fit import pack_problem
from thaw.log import get_logger
from thaw.wire import AssignRequest
from worker.agent import Agent
from worker.errors import Conflict
from worker.heartbeat import Heartbeat
from worker.settings import AgentSettings
from worker.spare import SpareHost

log = get_logger()


class PackedEngines:
    def __init__(self, owner: Agent, *, agent_deps: dict[str, Any] | None = None) -> None:
        self._owner = owner
        self._deps = agent_deps or {}
        self._engines: dict[str, Agent] = {}
        self._beats: dict[str, Heartbeat] = {}
        self._lock = asyncio.Lock()
        self._closing = False
        self._removals: set[asyncio.Task[None]] = set()
        owner.packed_engines = lambda: sorted(self._engines)
        # A worker that packs keeps an engine host imported for the next packed engine.
        s = owner.settings
        self._spare = SpareHost(owner.spawn_engine_host) if s.capacity_bytes > 0 and not s.packed else None

    def start(self) -> None:
        if self._spare is not None:
            self._spare.fill()

    def get(self, engine_id: str) -> Agent | None:
        return self._engines.get(engine_id)

    def held(self) -> list[int]:
        """The memory each engine on this worker holds now (the worker's own too)."""
        out = []
        for agent in (self._owner, *self._engines.values()):
            a = agent.facts.assignment
            if a is not None:
                out.append(a.memory_bytes or 0)
        return out

    async def create(self, req: AssignRequest, traceparent: str | None = None) -> Agent:
        """Start a packed engine for ``req`` (its ``engine_id`` and ``memory_bytes`` are
        required). The same ``engine_id`` again returns the engine already running.
        Raises :class:`Conflict` when it does not fit or this worker does not pack.
        ``traceparent``: the call's trace, which the engine's load joins."""
        owner = self._owner
        s = owner.settings
        if req.engine_id is None or req.memory_bytes is None:
            raise Conflict("a packed engine needs engine_id and memory_bytes", owner.state)
        async with self._lock:
            existing = self._engines.get(req.engine_id)
            if existing is not None:
                return existing
            if self._closing:
                raise Conflict("the worker is stopping", owner.state)
            if s.capacity_bytes <= 0 or s.packed:
                raise Conflict("this worker does not pack engines (its pool has no pack: true)", owner.state)
            own = owner.facts.assignment
            if own is not None and own.memory_bytes is None:
                raise Conflict(f"the memory of this worker's own engine ({own.model}) is not known: nothing is "
                               "packed beside it", owner.state)
            problem = pack_problem(req.memory_bytes, self.held(), s.capacity_bytes)
            if problem is not None:
                log.info("pack_refused", engine_id=req.engine_id, model=req.model, reason=problem)
                raise Conflict(f"{req.model} does not fit on worker {s.worker_id}: {problem}", owner.state)
            deps = dict(self._deps)
            if self._spare is not None:
                deps["spawn_host"] = self._spare.take
            agent = Agent(self._settings_for(req.engine_id), **deps)
            agent.on_released = lambda: self._remove_soon(req.engine_id)
            self._engines[req.engine_id] = agent
            try:
                await agent.start()
                agent.load_traces.assigned(req.assignment_id, traceparent)
                await agent.assign(req)
            except BaseException:
                self._engines.pop(req.engine_id, None)
                await agent.stop()
                raise
            if s.controller_url and s.token:
                beat = Heartbeat(agent.view, s.controller_url, s.token, interval_s=s.heartbeat_interval_s,
                                 on_failures=agent.metrics.heartbeats.set)
                agent.on_state_change = beat.kick
                self._beats[req.engine_id] = beat
                await beat.start()
        log.info("engine_packed", engine_id=req.engine_id, model=req.model, memory_bytes=req.memory_bytes,
                 held=sum(self.held()), capacity_bytes=s.capacity_bytes)
        self._changed()
        return agent

    def _settings_for(self, engine_id: str) -> AgentSettings:
        s = self._owner.settings
        return replace(
            s, worker_id=engine_id, host_worker_id=s.worker_id, control_path=f"/engines/{engine_id}",
            # Its own scratch space (an agent empties its snapshot work dir at start); the
            # disk cache stays shared; the host-memory tier is the worker's own.
            data_dir=s.data_dir / "engines" / engine_id, host_cache_dir=None, host_cache_max_bytes=0,
            capacity_bytes=0, exit_when_orphaned_s=None)

    def _changed(self) -> None:
        if self._owner.on_state_change is not None:
            self._owner.on_state_change()  # the worker's heartbeat lists its engines

    def _remove_soon(self, engine_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._remove(engine_id), name="remove_engine")
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove(self, engine_id: str) -> None:
        agent = self._engines.get(engine_id)
        if agent is None:
            return
        beat = self._beats.pop(engine_id, None)
        if beat is not None:
            await beat.close()
        await agent.stop()
        self._engines.pop(engine_id, None)
        log.info("engine_removed", engine_id=engine_id)
        self._changed()

    async def close(self) -> None:
        """Stop every packed engine (the worker is stopping)."""
        self._closing = True
        await asyncio.gather(*self._removals, return_exceptions=True)
        for engine_id in list(self._engines):
            beat = self._beats.pop(engine_id, None)
            if beat is not None:
                await beat.close()
        await asyncio.gather(*(a.stop() for a in self._engines.values()), return_exceptions=True)
        self._engines.clear()
        if self._spare is not None:
            await self._spare.close()
