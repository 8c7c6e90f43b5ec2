"""The agent's background tasks, in two kinds that shutdown treats differently.

- ``spawn``: cancelled on shutdown (assignments, releases, pollers, restarts).
- ``spawn_shielded``: awaited on shutdown, never cancelled. Engine-host replacements
  are of this kind: a half-spawned process would be an orphan nobody knows of.

A task that fails is logged with its name; nothing else looks at its exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from thaw.log import get_logger

log = get_logger()


class Tasks:
    def __init__(self) -> None:
        self._cancellable: set[asyncio.Task[Any]] = set()
        self._shielded: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._track(asyncio.create_task(coro, name=name), self._cancellable)

    def spawn_shielded(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return self._track(asyncio.create_task(coro, name=name), self._shielded)

    def _track(self, task: asyncio.Task[Any], into: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
        into.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._cancellable.discard(task)
        self._shielded.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent_task_failed", task=task.get_name(), exc_info=task.exception())

    async def cancel_all(self) -> None:
        """Cancel every cancellable task and wait for them to end."""
        tasks = list(self._cancellable)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_shielded(self) -> None:
        await asyncio.gather(*list(self._shielded), return_exceptions=True)
