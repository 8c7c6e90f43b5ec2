"""One engine host kept imported for the next packed engine (``worker.engines``).

A standby pays vLLM's imports before any request; a packed engine would pay them in
its cold start (14 s here on a busy 2-core machine), since it needs an engine host of
its own. A worker that packs therefore keeps one spare engine host standing by and hands
it to the next packed engine, whose supervisor takes it as if it had just spawned it
(its "imported" event is passed on, or replayed when it came before the handover), and
starts the next spare. Its memory (about 0.65 GiB) is reserved out of the worker's
capacity (``thaw.fit.SPARE_ENGINE_HOST_GIB``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from thaw.log import get_logger
from worker.host import EngineHost, OnEvent
from worker.launch import EV_IMPORTED
from worker.supervisor import HostSpawner

log = get_logger()

# A spare that died before it was taken is replaced after this long (not in a loop).
RESPAWN_DELAY_S = 5.0


class _Relay:
    """The spare's event handler: remembers "imported", and forwards to the agent that
    took the host."""

    def __init__(self) -> None:
        self.imported: dict[str, Any] | None = None
        self.target: OnEvent | None = None

    def on_event(self, host: EngineHost, event: dict[str, Any]) -> None:
        if event.get("event") == EV_IMPORTED:
            self.imported = event
        if self.target is not None:
            self.target(host, event)


class SpareHost:
    def __init__(self, spawn: HostSpawner) -> None:
        self._spawn = spawn
        self._host: EngineHost | None = None
        self._relay: _Relay | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._filling = False
        self._closed = False

    def _run(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def fill(self, delay_s: float = 0.0) -> None:
        """Start a spare engine host unless there is one (or one is starting)."""
        if self._closed or self._filling or self._host is not None:
            return
        self._filling = True
        self._run(self._fill(delay_s), "spare_engine_host")

    async def _fill(self, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        relay = _Relay()
        try:
            host = await self._spawn(relay.on_event)
        except Exception:
            log.exception("spare_engine_host_spawn_failed")
            self._filling = False
            self.fill(RESPAWN_DELAY_S)
            return
        self._filling = False
        if self._closed:
            await host.stop(0)
            return
        self._host, self._relay = host, relay
        log.info("spare_engine_host_started", host_pid=host.pid)
        self._run(self._watch(host), "spare_engine_host_watch")

    async def _watch(self, host: EngineHost) -> None:
        code = await host.wait()
        if self._host is host:  # died while spare (once taken, its supervisor watches it)
            self._host = self._relay = None
            log.warning("spare_engine_host_exited", host_pid=host.pid, returncode=code,
                        output_tail=host.output_tail()[-1000:])
            self.fill(RESPAWN_DELAY_S)

    @property
    def imported(self) -> bool:
        """A spare stands by with its imports done."""
        return self._host is not None and self._relay is not None and self._relay.imported is not None

    async def wait_imported(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until a spare stands by imported; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.imported:
            if self._closed or time.monotonic() > deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    async def take(self, on_event: OnEvent, *, refill: bool = True) -> EngineHost:
        """The spare, now reporting to ``on_event`` (a fresh host when there is none);
        the next spare starts unless ``refill`` is False."""
        host, relay = self._host, self._relay
        if host is None or relay is None or host.returncode is not None:
            if refill:
                self.fill()
            return await self._spawn(on_event)
        self._host = self._relay = None
        relay.target = on_event
        if relay.imported is not None:
            # It stood by before this owner had it: tell the owner now, as it would have.
            event = {**relay.imported, "t": time.time(), "handed_over": True}
            asyncio.get_running_loop().call_soon(on_event, host, event)
        log.info("spare_engine_host_taken", host_pid=host.pid, imported=relay.imported is not None)
        if refill:
            self.fill()
        return host

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        host, self._host = self._host, None
        if host is not None:
            await host.stop(0)
