"""Supervision of the agent's engine host process: start, replace, watch, restart.

The agent keeps one engine host (``worker.host``) standing by, with vLLM imported,
so that a launch pays no imports. :class:`HostSupervisor` owns that process: it
starts it, replaces it (SIGTERM and a grace period, or SIGKILL), watches it exit and
starts the next one, with a backoff when hosts die before they ever stood by.

It records the two host facts (``host_running``, ``host_imported``) through its
owner and hands every other event and every unexpected exit to the owner, which
decides what they mean for the assignment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from thaw.log import get_logger
from worker.host import EngineHost, OnEvent
from worker.launch import EV_IMPORTED
from worker.state import Facts
from worker.tasks import Tasks

log = get_logger()

HostSpawner = Callable[[OnEvent], Awaitable[EngineHost]]
# Characters of engine output quoted in a failure reason.
REASON_TAIL_CHARS = 1500


class HostOwner(Protocol):
    """What the supervisor needs from the agent."""

    @property
    def facts(self) -> Facts: ...
    def record(self, **changes: Any) -> None: ...
    def host_event(self, kind: str, event: dict[str, Any]) -> None: ...
    def host_exited(self, facts: Facts, code: int, tail: str) -> None: ...
    def host_gone(self) -> None: ...
    def host_unwell(self, reason: str) -> None: ...


class HostSupervisor:
    def __init__(self, owner: HostOwner, spawn: HostSpawner, tasks: Tasks, *, stop_grace_s: float,
                 restart_backoff_max_s: float, once: bool = False) -> None:
        """``once``: start one engine host and never another (a packed engine's: it
        serves one assignment; replacing it only stops it)."""
        self._owner = owner
        self._spawn = spawn
        self._tasks = tasks
        self._stop_grace_s = stop_grace_s
        self._backoff_max_s = restart_backoff_max_s
        self._host: EngineHost | None = None
        self._lock = asyncio.Lock()
        self._closing = False
        # Engine hosts in a row that died before "imported" (restart backoff).
        self._early_exits = 0
        self._once = once
        self._spawned = False

    @property
    def host(self) -> EngineHost | None:
        return self._host

    def grace_s(self, graceful: bool) -> float:
        return self._stop_grace_s if graceful else 0.0

    def replace(self, graceful: bool = True) -> asyncio.Task[None]:
        """Stop the current engine host (if any: SIGTERM and a grace period when
        ``graceful``, else SIGKILL) and start a fresh one.

        Runs as a shielded task that shutdown waits for instead of cancelling, so a
        process being spawned is always known to the agent when it stops.
        """
        if self._host is not None and self._owner.facts.host_imported:
            # Not standing by from now on: the host that imported is on its way out (a
            # release right after a failure must not see "standby" before the new one).
            self._owner.record(host_imported=False)
        return self._tasks.spawn_shielded(self._replace(graceful), name="replace_host")

    async def _replace(self, graceful: bool) -> None:
        async with self._lock:
            old, self._host = self._host, None
            if old is not None:
                # From here on its events and its exit are not ours to act on.
                self._owner.record(host_running=False, host_imported=False)
                await old.stop(self.grace_s(graceful))
                self._owner.host_gone()
            if self._closing or (self._once and self._spawned):
                return
            self._spawned = True
            try:
                host = await self._spawn(self._on_event)
            except Exception as exc:  # e.g. the interpreter is gone
                log.exception("engine_host_spawn_failed")
                self._early_exits += 1
                self._owner.host_unwell(f"cannot start the engine host: {exc}")
                self._schedule_restart()
                return
            self._host = host
            self._owner.record(host_running=True, host_imported=False)
            self._tasks.spawn(self._watch(host), name="watch_host")

    def shutting_down(self) -> None:
        """From now on no new engine host is started (call before cancelling tasks)."""
        self._closing = True

    async def close(self, graceful: bool) -> None:
        """Let replacements under way finish, then stop the host for good."""
        self._closing = True
        await self._tasks.wait_shielded()
        async with self._lock:
            host, self._host = self._host, None
            if host is not None:
                await host.stop(self.grace_s(graceful))
                self._owner.host_gone()

    def _schedule_restart(self) -> None:
        delay = 0.0
        if self._early_exits:
            delay = min(self._backoff_max_s, 2.0 ** (self._early_exits - 1))

        async def restart() -> None:
            await asyncio.sleep(delay)
            await self.replace()

        self._tasks.spawn(restart(), name="restart_host")

    def _on_event(self, host: EngineHost, event: dict[str, Any]) -> None:
        if host is not self._host:
            return  # a host being replaced
        kind = event["event"]
        if kind == EV_IMPORTED:
            self._early_exits = 0
            self._owner.record(host_imported=True)
        else:
            self._owner.host_event(kind, event)

    async def _watch(self, host: EngineHost) -> None:
        code = await host.wait()
        if host is not self._host:
            return  # stopped on purpose
        self._host = None
        f = self._owner.facts
        self._owner.record(host_running=False, host_imported=False)
        self._owner.host_gone()
        self._early_exits = 0 if f.host_imported else self._early_exits + 1
        tail = host.output_tail()[-REASON_TAIL_CHARS:]
        log.error("engine_host_exited", host_pid=host.pid, returncode=code, output_tail=tail)
        if f.release_requested_at is None:
            self._owner.host_exited(f, code, tail)
            if not self._once:
                self._schedule_restart()
        # During a release, the release flow starts the next engine host.
