"""Many workers in one process, for measuring the control plane at fleet size (`thaw
bench control-plane`): each speaks the worker protocol to the real controller and
activators, and only its engine is simulated.

    python -m loadtests.sim_fleet --port P --controller URL[,URL] --token T --workers 1000 [--load-s 1.0]

Per worker, as ``worker/`` does it:

- heartbeats (a :class:`thaw.wire.WorkerStatus` to ``/v1/workers/heartbeat``) every
  interval the controller's reply asks for, and at once on every state change; the
  reply's term fences control calls of an older leader (409, as ``worker/fence.py``);
  among several controllers they go to the leader (``thaw.controllers``), so a
  takeover at fleet size can be measured;
- its control API under ``/w/<worker id>``: ``POST /assign`` (202; the same assignment
  again is a no-op; any other while not standing by is a 409), ``POST /release``
  (draining until its requests in flight end, then standby), ``GET /state``; what a
  simulated engine cannot do (``/sleep``, ``/prebuild``, ``/engines``, adapters) is a
  409 naming why;
- its engine under ``/e/<worker id>``, ready ``--load-s`` after the assignment: it
  streams completions as :mod:`loadtests.fast_upstream` does, counting those in flight;
  a completion sent to a worker with no engine (released, or still loading) has its
  connection dropped, as a real worker's closed engine port refuses it.

Workers register themselves on a local pool (a local pool admits a worker no provider
launched), so the controller's provider launches nothing while the pool has standbys.
It is a bare asyncio HTTP/1.1 server and one HTTP client, so a thousand workers cost
one process a few percent of a core between heartbeats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from loadtests.bare_client import BareClient
from loadtests.fast_upstream import Upstream, _send, serve_connection
from thaw.controllers import TERM_HEADER, Controllers
from thaw.wire import (
    AssignRequest,
    HeartbeatReply,
    Phases,
    ReleaseRequest,
    WorkerState,
    WorkerStatus,
)
from worker.fence import Fence
from worker.heartbeat import HEARTBEAT_PATH


@dataclass
class SimWorker:
    """One simulated worker: what its status reports, and its engine's requests in flight."""

    worker_id: str
    shape: str
    control_url: str
    engine_base: str
    started_at: float = field(default_factory=time.time)
    state: WorkerState = WorkerState.STANDBY
    state_since: float = field(default_factory=time.time)
    assignment: AssignRequest | None = None
    assigned_at: float | None = None
    ready_at: float | None = None
    in_flight: int = 0
    # The leader's term it has heard of (worker.fence: older terms are refused).
    fence: Fence = field(default_factory=Fence)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # Counters the harness reads (GET /stats).
    assigns: int = 0
    releases: int = 0
    # While set, its heartbeats are not sent: a worker cut off from the controllers (or
    # one a takeover's new leader hears from late).
    silent: bool = False
    # The statuses it has given (WorkerStatus.seq).
    seq: int = 0

    def status(self) -> WorkerStatus:
        a = self.assignment
        ready = self.state is WorkerState.READY
        self.seq += 1
        return WorkerStatus(seq=self.seq,
            worker_id=self.worker_id, instance_id=f"sim-{self.worker_id}", shape=self.shape, state=self.state,
            control_url=self.control_url, model=a.model if a else None,
            assignment_id=a.assignment_id if a else None, revision=a.revision if a else None,
            batch=a.batch if a else False, served_model_name=a.served_model_name if a else None,
            engine_url=self.engine_base if ready else None, started_at=self.started_at,
            state_since=self.state_since,
            phases=Phases(assigned=self.assigned_at, weights_loaded=self.ready_at, engine_ready=self.ready_at)
            if a else Phases())

    def enter(self, state: WorkerState) -> None:
        self.state, self.state_since = state, time.time()
        self.changed.set()


class SimFleet:
    def __init__(self, port: int, controller_url: str, token: str, *, workers: int, shape: str = "sim",
                 load_s: float = 1.0, tokens: int = 8, prefix: str = "sim",
                 first_heartbeat_within_s: float = 2.0) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        # ``URL[,URL]``: heartbeats go to the leader among the controllers.
        self.controllers = Controllers(controller_url)
        self.token = token
        self.load_s = load_s
        self.workers = {wid: SimWorker(wid, shape, f"{self.base}/w/{wid}", f"{self.base}/e/{wid}")
                        for wid in (f"{prefix}-{i:05d}" for i in range(workers))}
        self.engine = Upstream(port, "sim", tokens, 0.0)
        self.interval_s = 2.0
        self.first_heartbeat_within_s = first_heartbeat_within_s
        self.heartbeats = {"sent": 0, "refused": 0, "failed": 0}
        self._tasks: set[asyncio.Task[None]] = set()
        # Heartbeats through a bare client: with httpx's, a thousand workers' cost the
        # harness most of a core, taken from the controller it measures.
        self._http = BareClient({"Authorization": f"Bearer {token}"}, timeout_s=10.0, connect_timeout_s=5.0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- heartbeats -------------------------------------------------------------------
    async def _heartbeat(self, w: SimWorker) -> None:
        # Spread over the first interval, so a thousand workers do not arrive at once.
        await asyncio.sleep(random.random() * self.first_heartbeat_within_s)  # noqa: S311 - jitter, not security
        while True:
            w.changed.clear()
            body = w.status().model_dump_json()
            try:
                if w.silent:
                    raise httpx.ConnectError("this simulated worker is cut off from the controllers")
                r = await self.controllers.request(self._http, "POST", HEARTBEAT_PATH, content=body,
                                                   headers={"content-type": "application/json"})
                if r.status_code == 200:
                    reply = HeartbeatReply.model_validate_json(r.content)
                    self.interval_s = reply.interval_s
                    w.fence.observe(reply.term)
                    self.heartbeats["sent"] += 1
                else:
                    self.heartbeats["refused"] += 1
            except httpx.HTTPError:
                self.heartbeats["failed"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.changed.wait(), self.interval_s)

    # -- the control API --------------------------------------------------------------
    async def assign(self, w: SimWorker, req: AssignRequest) -> tuple[int, Any]:
        if w.assignment is not None and w.assignment.assignment_id == req.assignment_id \
                and w.state is not WorkerState.DRAINING:
            return 202, w.status()
        if w.state is not WorkerState.STANDBY:
            return 409, {"error": f"worker is {w.state.value}, not standby; it takes an assignment only in standby",
                         "state": w.state.value}
        w.assignment, w.assigned_at, w.ready_at = req, time.time(), None
        w.assigns += 1
        w.enter(WorkerState.LOADING)
        self._spawn(self._load(w, req.assignment_id))
        return 202, w.status()

    async def _load(self, w: SimWorker, assignment_id: str) -> None:
        await asyncio.sleep(self.load_s)
        if w.assignment is not None and w.assignment.assignment_id == assignment_id \
                and w.state is WorkerState.LOADING:
            w.ready_at = time.time()
            w.enter(WorkerState.READY)

    async def release(self, w: SimWorker, req: ReleaseRequest) -> tuple[int, Any]:
        if w.assignment is None:
            return 200, w.status()
        if req.assignment_id is not None and req.assignment_id != w.assignment.assignment_id:
            return 409, {"error": f"assignment {req.assignment_id!r} is not the current one "
                                  f"({w.assignment.assignment_id!r})", "state": w.state.value}
        if w.state is WorkerState.DRAINING:
            return 202, w.status()
        w.releases += 1
        w.enter(WorkerState.DRAINING)
        self._spawn(self._drain(w, req.drain_timeout_s))
        return 202, w.status()

    async def _drain(self, w: SimWorker, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while w.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110 - the engine signals nothing
            await asyncio.sleep(0.05)
        w.assignment, w.assigned_at, w.ready_at = None, None, None
        w.enter(WorkerState.STANDBY)

    async def control(self, w: SimWorker, method: str, op: str, headers: dict[str, str],
                      body: bytes) -> tuple[int, Any]:
        if method == "GET" and op == "/state":
            return 200, w.status()
        if method != "POST":
            return 405, {"error": f"{method} {op} is not a worker route"}
        raw = headers.get(TERM_HEADER.lower())
        if raw is not None and not raw.lstrip("-").isdigit():
            return 400, {"error": f"{TERM_HEADER} must be an integer"}
        if raw is not None and not w.fence.admits(int(raw)):
            return 409, {"error": f"a call of the controllers' term {raw}, but term {w.fence.term} leads now: this "
                                  "controller no longer leads"}
        try:
            if op == "/assign":
                return await self.assign(w, AssignRequest.model_validate_json(body))
            if op == "/release":
                return await self.release(w, ReleaseRequest.model_validate_json(body or b"{}"))
        except ValidationError as exc:
            return 422, {"error": f"invalid request body: {exc.errors()[0]['msg']}"}
        if op in ("/sleep", "/prebuild", "/engines", "/adapters", "/adapters/unload"):
            return 409, {"error": f"{op}: a simulated engine cannot do this", "state": w.state.value}
        return 404, {"error": f"no route POST {op}"}

    # -- HTTP/1.1 ---------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, self.dispatch)

    async def dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes,
                       w: asyncio.StreamWriter) -> None:
        path = target.partition("?")[0]
        if path == "/stats":
            return _send(w, 200, self.stats())
        kind, _, rest = path.lstrip("/").partition("/")
        wid, _, op = rest.partition("/")
        worker = self.workers.get(wid)
        if kind not in ("w", "e") or worker is None:
            return _send(w, 404, {"error": f"no worker at {path}"})
        if kind == "w":
            status, answer = await self.control(worker, method, "/" + op, headers, body)
            return _send(w, status, answer.model_dump(mode="json") if isinstance(answer, WorkerStatus) else answer)
        if op in ("health", "healthz"):
            return _send(w, 200 if worker.state is WorkerState.READY else 503, {})
        if method != "POST" or op not in ("v1/chat/completions", "v1/completions"):
            return _send(w, 404, {"error": {"message": f"no route {method} /{op}", "type": "not_found"}})
        a = worker.assignment
        if worker.state not in (WorkerState.READY, WorkerState.DRAINING) or a is None:
            # No engine runs there (released and drained, or not loaded yet): a real
            # worker's engine port refuses the connection, which the activator retries on
            # another replica; so the connection is dropped, not answered.
            raise ConnectionResetError(f"no engine runs on {wid}")
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return _send(w, 400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
        worker.in_flight += 1
        try:
            await self.engine.complete(op.endswith("chat/completions"), req, w, a.served_model_name)
        finally:
            worker.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for wk in self.workers.values():
            states[wk.state.value] = states.get(wk.state.value, 0) + 1
        return {"workers": len(self.workers), "states": states, "heartbeats": dict(self.heartbeats),
                "assigns": sum(wk.assigns for wk in self.workers.values()),
                "releases": sum(wk.releases for wk in self.workers.values())}

    # -- lifecycle --------------------------------------------------------------------
    async def serve(self, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", self.port, backlog=4096)
        for wk in self.workers.values():
            self._spawn(self._heartbeat(wk))
        if ready is not None:
            ready.set()
        try:
            async with server:
                await server.serve_forever()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every worker's heartbeat and step, and the HTTP client."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.aclose()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--controller", required=True, help="the controller's URL (URL,URL: several, one leads)")
    p.add_argument("--token", required=True, help="the cluster token")
    p.add_argument("--workers", type=int, default=100)
    p.add_argument("--shape", default="sim")
    p.add_argument("--prefix", default="sim", help="worker ids are PREFIX-00000, ...")
    p.add_argument("--load-s", type=float, default=1.0, help="seconds from an assignment to ready")
    p.add_argument("--tokens", type=int, default=8, help="tokens per completion without max_tokens")
    args = p.parse_args(argv)
    fleet = SimFleet(args.port, args.controller, args.token, workers=args.workers, shape=args.shape,
                     load_s=args.load_s, tokens=args.tokens, prefix=args.prefix)
    asyncio.run(fleet.serve())


if __name__ == "__main__":
    main()
