"""Batch lines run on room online traffic leaves (OpenAI's Batches API).

Each tick the worker asks, for each model with ready replicas here, how many batch
requests it takes now (``Router.batch_room``: none while an online request waits
for the model; else up to ``batch.max_share`` of its slots, within the free ones),
leases that many lines from the controller and runs each on a slot of its own, answered
whole (``CompletionService.run_batch_line``), then sends the answer. An online request
that finds every slot taken cuts one batch request of its model at once
(``Router.yield_batch_with``): the slot is handed to it, and the cut line is given back
to the controller to run later. A line whose standby the controller took back for an
online cold start (its engine stopped mid-request) is given back the same way; a line
whose run fails otherwise (a replica gone) is given back counting a failure (three and
it is answered with an error); an answer no controller takes (one restarting) is sent again while the lease
lasts, and a line whose answer never arrives runs again when its lease ends (the
controller keeps only the first answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from activator.answer import UPSTREAM_PATH
from activator.context import RequestContext
from activator.protocol import Kind
from activator.routing.replicas import Replica
from activator.routing.router import Router
from activator.service import CompletionService
from thaw.config import BatchConfig
from thaw.controllers import ControllerClient
from thaw.log import get_logger
from thaw.wire import LeasedLine, LeasedLines, LeaseLines, LineRef, LineResult, ReleaseLine

log = get_logger()

# An answer no controller took is sent again after this long, doubling up to the max,
# for this long at least (a controller restarting takes seconds; one failing over, its
# lease).
ANSWER_RETRY_S = 0.5
ANSWER_RETRY_MAX_S = 5.0
ANSWER_RETRY_FOR_S = 300.0
# How long a line whose standby died waits for the route table to say whether the
# controller took that standby back (a cut, not a failure of the line).
PREEMPTED_WAIT_S = 5.0
# A batch's endpoint -> the kind of request its lines are.
KINDS: dict[str, Kind] = {path: kind for kind, path in UPSTREAM_PATH.items()}


class BatchWorker:
    def __init__(self, service: CompletionService, routes: Router, controller: ControllerClient, owner: str,
                 cfg: BatchConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.routes = routes
        self.owner = owner
        self.cfg = cfg
        self.clock = clock
        self.controller = controller
        # model -> (batch id, line) -> the task running it.
        self.running: dict[str, dict[tuple[str, int], asyncio.Task[None]]] = {}
        # model -> the tasks holding a slot now, in the order they took it.
        self.holding: dict[str, list[asyncio.Task[None]]] = {}
        self._cut: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._renewed_at = clock()
        self.metrics = service.metrics
        routes.yield_batch_with(self.yield_to_online)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch_worker")

    async def close(self) -> None:
        tasks = [t for lines in self.running.values() for t in lines.values()]
        for t in [self._task, *tasks]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in [self._task, *tasks] if t is not None), return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("batch_step_failed")
            await asyncio.sleep(self.cfg.poll_interval_s)

    def room(self) -> dict[str, int]:
        """Per model, the batch requests it takes now."""
        out = {}
        for name in self.routes.model_names():
            n = self.routes.batch_room(name, self.cfg.max_share, len(self.running.get(name, {})))
            if n > 0:
                out[name] = n
        return out

    async def step(self) -> None:
        room = self.room()
        now = self.clock()
        # The leases on the lines running here are renewed every lease_s / 3.
        renew = now - self._renewed_at >= self.cfg.lease_s / 3
        running = [LineRef(batch_id=b, line=n) for lines in self.running.values() for b, n in lines] if renew else []
        if not room and not running:
            return
        ask = LeaseLines(owner=self.owner, models=sorted(room), n=min(sum(room.values()), 1000),
                         lease_s=self.cfg.lease_s, running=running)
        r = await self._post("/v1/batch-lines/lease", ask.model_dump_json())
        if r is None or r.status_code != 200:
            return
        if renew:
            self._renewed_at = now
        for line in LeasedLines.model_validate_json(r.content).lines:
            task = asyncio.create_task(self._run(line), name="batch_line")
            self.running.setdefault(line.model, {})[(line.batch_id, line.line)] = task

    def yield_to_online(self, model: str) -> None:
        """Cut the batch request of ``model`` that took its slot last (the least work
        lost)."""
        holding = [t for t in self.holding.get(model, []) if t not in self._cut and not t.done()]
        if holding:
            task = holding[-1]
            self._cut.add(task)
            task.cancel()
            self.metrics.batch_lines.labels(model, "yielded").inc()

    async def _run(self, line: LeasedLine) -> None:
        key = (line.batch_id, line.line)
        task = asyncio.current_task()
        try:
            model = self.service.cfg.model(line.model)
            if model is None:  # removed since the batch was validated
                await self._answer(line, LineResult(error={"code": "model_not_found",
                                                           "message": f"the model {line.model!r} was removed"}))
                return
            replica = self.routes.take_batch_slot(line.model)
            if replica is None:  # online traffic took the room meanwhile
                await self._give_back(line)
                return
            ctx = RequestContext(request_id=f"batch-{uuid.uuid4().hex}", arrival=self.clock())
            assert task is not None
            holders = self.holding.setdefault(line.model, [])
            holders.append(task)
            self.metrics.batch_running.labels(line.model).set(len(holders))

            def free() -> None:
                if task in holders:
                    holders.remove(task)
                    self.metrics.batch_running.labels(line.model).set(len(holders))
                    self.routes.release(line.model, replica)

            try:
                status, content = await self.service.run_batch_line(line.tenant, model, KINDS[line.endpoint],
                                                                    line.body, replica, ctx)
            except asyncio.CancelledError:
                # Cut for an online request (or this activator stopping): the slot
                # first, then the line goes back to run elsewhere or later.
                free()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._give_back(line), 5)
                if task in self._cut:
                    return
                raise
            except Exception as exc:
                free()
                if replica.batch and await self._taken_back(replica):
                    # Its standby was taken back for an online cold start: the line was cut,
                    # not failed, and goes back to run later without counting against it.
                    log.info("batch_line_preempted", batch_id=line.batch_id, line=line.line,
                             worker_id=replica.worker_id)
                    self.metrics.batch_lines.labels(line.model, "preempted").inc()
                    await self._give_back(line)
                    return
                log.warning("batch_line_failed", batch_id=line.batch_id, line=line.line, error=repr(exc))
                await self._give_back(line, failure=f"{type(exc).__name__}: {exc}"[:2000])
                return
            finally:
                free()
            try:
                body: Any = json.loads(content)
            except ValueError:
                body = {"error": {"message": content.decode("utf-8", "replace")[:2000]}}
            kept = await self._answer(line, LineResult(response={"status_code": status,
                                                                 "request_id": ctx.request_id, "body": body}))
            if kept:
                # Billed once: the run whose answer the line keeps (another run of it, one
                # whose answer came second or never arrived, is not).
                code = (body.get("error") or {}).get("code") if status >= 400 and isinstance(body, dict) else None
                await self.service.record(ctx, code)
        finally:
            self.running.get(line.model, {}).pop(key, None)
            if task is not None:
                self._cut.discard(task)

    async def _taken_back(self, replica: Replica) -> bool:
        """Whether the route table shows ``replica``'s worker taken for other work,
        waiting up to PREEMPTED_WAIT_S for it (the engine dies as the assignment that
        takes it back starts; the table says so within a feed's turn)."""
        until = self.clock() + PREEMPTED_WAIT_S
        while not self.routes.taken_back(replica):
            if self.clock() >= until:
                return False
            await asyncio.sleep(0.1)
        return True

    async def _answer(self, line: LeasedLine, result: LineResult) -> bool:
        """Send the answer, again and again while no controller takes it (one restarting)
        for up to ANSWER_RETRY_FOR_S: the line is not run twice for want of a controller
        (past its lease it may run again, and the controller keeps the first answer).
        Whether this answer is the one kept."""
        path = f"/v1/batch-lines/{line.batch_id}/{line.line}/result"
        body = result.model_dump_json()
        delay = ANSWER_RETRY_S
        until = self.clock() + max(self.cfg.lease_s, ANSWER_RETRY_FOR_S)
        while True:
            r = await self._post(path, body)
            if r is not None and r.status_code == 200:
                kept = bool(r.json().get("kept"))
                self.metrics.batch_lines.labels(line.model, "answered" if kept else "answered_twice").inc()
                return kept
            if (r is not None and r.status_code < 500) or self.clock() + delay >= until:
                log.warning("batch_answer_not_sent", batch_id=line.batch_id, line=line.line,
                            status=r.status_code if r is not None else None)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, ANSWER_RETRY_MAX_S)

    async def _give_back(self, line: LeasedLine, failure: str | None = None) -> None:
        """The line runs again later (``failure``: its run failed; the controller answers
        it with an error after a few)."""
        self.metrics.batch_lines.labels(line.model, "failed" if failure else "given_back").inc()
        await self._post(f"/v1/batch-lines/{line.batch_id}/{line.line}/release",
                         ReleaseLine(owner=self.owner, failure=failure).model_dump_json())

    async def _post(self, path: str, body: str) -> httpx.Response | None:
        return await self.controller.post_json(path, body)
