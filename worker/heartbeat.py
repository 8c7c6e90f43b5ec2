"""The worker's heartbeat: its status to the controller, every few seconds and at once
on every state change.

A worker joins the fleet by heartbeating; the controller matches the instance id to its
provider's instances (403 for one it does not know). While the controller is down the
worker keeps serving and keeps trying. Among several controllers it follows the leader
(``thaw.controllers``). With ``exit_when_orphaned_s`` (local workers) it
exits once no heartbeat has been accepted for that long, so a controller killed for good
leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx

from thaw.aio import wait_event
from thaw.auth import bearer
from thaw.controllers import Controllers
from thaw.log import get_logger
from thaw.wire import HeartbeatReply, WorkerStatus
from worker.fence import Fence

log = get_logger()

HEARTBEAT_PATH = "/v1/workers/heartbeat"


class Heartbeat:
    def __init__(
        self,
        status: Callable[[], WorkerStatus],
        controller_url: str,
        token: str,
        *,
        interval_s: float = 2.0,
        exit_when_orphaned_s: float | None = None,
        on_orphaned: Callable[[], None] | None = None,
        on_failures: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fence: Fence | None = None,
    ) -> None:
        self.status = status
        # ``URL[,URL]``: heartbeats go to the leader among the controllers.
        self.controllers = Controllers(controller_url)
        self.interval_s = interval_s
        self.exit_when_orphaned_s = exit_when_orphaned_s
        self.on_orphaned = on_orphaned
        self.on_failures = on_failures
        self.clock = clock
        # Told the leader's term by each reply (control calls of older terms are refused).
        self.fence = fence
        self.epoch: str | None = None
        self.failures = 0
        self._headers = bearer(token)
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=2.0))
        self._accepted_at = clock()

    def __repr__(self) -> str:
        return f"Heartbeat(controller={self.controllers.url!r}, failures={self.failures})"

    def kick(self) -> None:
        """Send one now (a state change)."""
        self._kick.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._http.aclose()

    async def send_once(self) -> bool:
        """One heartbeat; True when the controller accepted it."""
        body = self.status().model_dump(mode="json")
        try:
            r = await self.controllers.request(self._http, "POST", HEARTBEAT_PATH, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            self._failed("heartbeat_failed", error=str(exc) or type(exc).__name__)
            return False
        if r.status_code != 200:
            # 403: the controller does not know this instance; 401: another cluster's token.
            self._failed("heartbeat_refused", status=r.status_code, body=r.text[:300])
            return False
        try:
            reply = HeartbeatReply.model_validate_json(r.content)
        except ValueError:
            self._failed("heartbeat_bad_reply", body=r.text[:300])
            return False
        if reply.controller_epoch != self.epoch:
            log.info("controller_joined", epoch=reply.controller_epoch, previous=self.epoch)
            self.epoch = reply.controller_epoch
        self.interval_s = reply.interval_s
        if self.fence is not None:
            self.fence.observe(reply.term)
        if self.failures:
            log.info("heartbeat_restored", after_failures=self.failures)
        self.failures = 0
        self._accepted_at = self.clock()
        if self.on_failures is not None:
            self.on_failures(0)
        return True

    def _failed(self, event: str, **kw: object) -> None:
        self.failures += 1
        if self.on_failures is not None:
            self.on_failures(self.failures)
        # The first failure and then one in ten: a long outage should not flood the log.
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning(event, failures=self.failures, **kw)

    async def _run(self) -> None:
        while True:
            self._kick.clear()
            await self.send_once()
            limit = self.exit_when_orphaned_s
            if limit is not None and self.clock() - self._accepted_at > limit:
                log.error("worker_orphaned", seconds_without_controller=round(self.clock() - self._accepted_at),
                          limit_s=limit)
                if self.on_orphaned is not None:
                    self.on_orphaned()
                return
            await wait_event(self._kick, self.interval_s)
