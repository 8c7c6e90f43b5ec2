"""The pool manager: the stateful shell around ``warm_pool.policy.decide``.

It gathers facts (workers' ``/state``, activators' traffic reports), calls the policy,
carries out its decisions through the provider and the workers' control APIs, and
publishes the route table (ready replicas per model, plus why a model is failing)
that activators long-poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from thaw.config import ThawConfig
from thaw.log import get_logger
from thaw.objstore import S3Endpoint
from warm_pool.policy import (
    Assign,
    Decision,
    Launch,
    ModelActivity,
    PolicyState,
    Release,
    Sleep,
    Snapshot,
    Terminate,
    WorkerView,
    decide,
)
from warm_pool.providers import Provider, WorkerHandle

log = get_logger()

REPORT_TTL_S = 10.0
# A worker that has not answered /state for this long is unreachable.
UNREACHABLE_AFTER_S = 15.0


@dataclass
class _Worker:
    handle: WorkerHandle
    launched_at: float
    view: WorkerView
    state_body: dict[str, Any] = field(default_factory=dict)
    last_seen: float | None = None


@dataclass
class _Report:
    at: float
    models: dict[str, ModelActivity]


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge("thaw_pool_workers", "Workers by shape and state", ["shape", "state"], registry=registry)
        self.decisions = Counter("thaw_pool_decisions_total", "Policy decisions carried out", ["kind", "reason"], registry=registry)
        self.tick = Histogram("thaw_pool_policy_seconds", "Time spent in one policy decision", registry=registry,
                              buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1))
        self.backoff = Gauge("thaw_model_backoff_seconds", "Seconds left in a model's load backoff", ["model"], registry=registry)


class PoolManager:
    def __init__(
        self,
        cfg: ThawConfig,
        provider: Provider,
        store: S3Endpoint,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        poll_interval_s: float = 0.25,
    ) -> None:
        self.cfg = cfg
        self.provider = provider
        self.store = store
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.registry = registry or CollectorRegistry()
        self.metrics = PoolMetrics(self.registry)
        self.state = PolicyState()
        self.workers: dict[str, _Worker] = {}
        self.reports: dict[str, _Report] = {}
        self.demand_at: dict[str, float] = {}
        self.cold_starts: dict[str, dict[str, Any]] = {}
        self.routes: dict[str, Any] = {"version": 0, "models": {}}
        self._routes_changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=1.0))
        self._task: asyncio.Task[None] | None = None
        self._inflight_ops: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()  # workers with a control call in flight

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pool-manager")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for t in list(self._inflight_ops):
            t.cancel()
        await asyncio.gather(*self._inflight_ops, return_exceptions=True)
        await self.provider.close()
        await self._http.aclose()

    # -- inputs ---------------------------------------------------------------------
    def report(self, activator_id: str, models: dict[str, ModelActivity]) -> None:
        self.reports[activator_id] = _Report(self.clock(), models)
        if any(a.queued for a in models.values()):
            self._wake.set()

    def demand(self, model: str) -> None:
        """A request is waiting for ``model`` at zero: decide now, not on the next tick."""
        self.demand_at[model] = self.clock()
        self._wake.set()

    def record_cold_start(self, model: str, record: dict[str, Any]) -> None:
        self.cold_starts[model] = record

    def activity(self, now: float) -> dict[str, ModelActivity]:
        out: dict[str, ModelActivity] = {}
        for rid, rep in list(self.reports.items()):
            if now - rep.at > REPORT_TTL_S:
                del self.reports[rid]
                continue
            for name, a in rep.models.items():
                cur = out.get(name, ModelActivity())
                last = max(filter(None, (cur.last_request_at, a.last_request_at)), default=None)
                out[name] = ModelActivity(cur.queued + a.queued, cur.in_flight + a.in_flight, last)
        for name, at in self.demand_at.items():
            cur = out.get(name, ModelActivity())
            # A demand signal counts as one queued request until a report covers it.
            recent = now - at < 2.0 and not cur.queued
            last = max(filter(None, (cur.last_request_at, at)), default=None)
            out[name] = ModelActivity(cur.queued + (1 if recent else 0), cur.in_flight, last)
        return out

    # -- the loop -------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self._poll_workers()
                self._tick()
                await self._publish_routes()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool_tick_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval_s)
            self._wake.clear()

    async def _poll_workers(self) -> None:
        now = self.clock()

        async def poll(w: _Worker) -> None:
            code = self.provider.exited(w.handle.id)
            if code is not None:
                w.view = WorkerView(w.handle.id, w.handle.shape, "unreachable", w.view.model,
                                    w.view.assignment_id, f"worker process exited with status {code}")
                return
            try:
                r = await self._http.get(f"{w.handle.control_url}/state")
                r.raise_for_status()
                body = r.json()
            except (httpx.HTTPError, ValueError):
                never = w.last_seen is None
                since = now - (w.launched_at if never else w.last_seen)  # type: ignore[operator]
                limit = 120.0 if never else UNREACHABLE_AFTER_S  # a new agent imports for a while
                if since > limit:
                    w.view = WorkerView(w.handle.id, w.handle.shape, "unreachable", w.view.model,
                                        w.view.assignment_id, "worker stopped answering")
                return
            w.last_seen = now
            w.state_body = body
            w.view = WorkerView(
                id=w.handle.id, shape=w.handle.shape, state=body["state"], model=body.get("model"),
                assignment_id=body.get("assignment_id"), error=body.get("error"),
                since=body.get("state_since"),
            )

        await asyncio.gather(*(poll(w) for w in self.workers.values() if w.handle.id not in self._busy))

    def _tick(self) -> None:
        now = self.clock()
        snap = Snapshot(workers=tuple(w.view for w in self.workers.values()), activity=self.activity(now))
        t0 = time.perf_counter()
        decisions, self.state = decide(snap, self.state, self.cfg, now)
        self.metrics.tick.observe(time.perf_counter() - t0)
        for d in decisions:
            self._carry_out(d)
        self._export(now)

    def _carry_out(self, d: Decision) -> None:
        kind = type(d).__name__.lower()
        self.metrics.decisions.labels(kind, getattr(d, "reason", "demand")).inc()
        log.info("pool_decision", kind=kind, **{k: v for k, v in d.__dict__.items()})
        if isinstance(d, Launch):
            self._spawn(self._launch(d.shape))
        elif isinstance(d, Assign):
            w = self.workers[d.worker_id]
            # Optimistic: the next decide must not hand this worker out again.
            w.view = WorkerView(w.handle.id, w.handle.shape, "loading", d.model, d.assignment_id)
            self._spawn(self._assign(w, d), busy=w.handle.id)
        elif isinstance(d, Release):
            w = self.workers[d.worker_id]
            w.view = WorkerView(w.handle.id, w.handle.shape, "draining", None, None)
            self._spawn(self._release(w, d), busy=w.handle.id)
        elif isinstance(d, Sleep):
            w = self.workers[d.worker_id]
            w.view = WorkerView(w.handle.id, w.handle.shape, "asleep", d.model, w.view.assignment_id,
                                since=self.clock())
            self._spawn(self._sleep(w, d), busy=w.handle.id)
        elif isinstance(d, Terminate):
            self.workers.pop(d.worker_id, None)
            self._spawn(self.provider.terminate(d.worker_id))

    def _spawn(self, coro: Any, busy: str | None = None) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("pool_action_failed")
            finally:
                if busy:
                    self._busy.discard(busy)
                self._wake.set()

        if busy:
            self._busy.add(busy)
        task = asyncio.create_task(run())
        self._inflight_ops.add(task)
        task.add_done_callback(self._inflight_ops.discard)

    async def _launch(self, shape: str) -> None:
        now = self.clock()
        placeholder = f"launching-{shape}-{now}"
        # Count the launch as a worker right away so the next tick does not launch again.
        self.workers[placeholder] = _Worker(WorkerHandle(placeholder, shape, ""), now,
                                            WorkerView(placeholder, shape, "launching"))
        self._busy.add(placeholder)
        try:
            handle = await self.provider.launch(shape)
        finally:
            self.workers.pop(placeholder, None)
            self._busy.discard(placeholder)
        self.workers[handle.id] = _Worker(handle, self.clock(), WorkerView(handle.id, shape, "starting"))

    async def _assign(self, w: _Worker, d: Assign) -> None:
        model = self.cfg.model(d.model)
        assert model is not None
        body = {
            "assignment_id": d.assignment_id,
            "model": model.name,
            "uri": model.uri,
            "served_model_name": model.resolved_served_name,
            "max_model_len": model.max_context_tokens,
            "engine": model.engine.model_dump(mode="json"),
            # The asleep tier needs the engine started with sleep mode.
            "sleep_mode": model.autoscaling.asleep_ttl_s > 0,
            "store": {"endpoint_url": self.store.endpoint_url, "access_key": self.store.access_key,
                      "secret_key": self.store.secret_key, "region": self.store.region},
        }
        r = await self._http.post(f"{w.handle.control_url}/assign", json=body)
        if r.status_code >= 400:
            log.warning("assign_refused", worker_id=w.handle.id, status=r.status_code, body=r.text[:500])
            w.view = WorkerView(w.handle.id, w.handle.shape, "starting")  # re-read on the next poll
            return
        w.state_body = r.json()
        log.info("worker_assigned", worker_id=w.handle.id, model=model.name, assignment_id=d.assignment_id)

    async def _sleep(self, w: _Worker, d: Sleep) -> None:
        r = await self._http.post(f"{w.handle.control_url}/sleep",
                                  json={"assignment_id": w.view.assignment_id, "drain_timeout_s": 30.0})
        if r.status_code >= 400:
            # E.g. an engine started without sleep mode: release it rather than ask again.
            log.warning("sleep_refused", worker_id=w.handle.id, status=r.status_code, body=r.text[:500])
            await self._release(w, Release(d.worker_id, d.model, "idle"))

    async def _release(self, w: _Worker, d: Release) -> None:
        r = await self._http.post(f"{w.handle.control_url}/release",
                                  json={"assignment_id": None, "drain_timeout_s": 30.0})
        if r.status_code >= 400:
            log.warning("release_refused", worker_id=w.handle.id, status=r.status_code, body=r.text[:500])

    # -- outputs --------------------------------------------------------------------
    def _export(self, now: float) -> None:
        counts: dict[tuple[str, str], int] = {}
        for w in self.workers.values():
            counts[(w.handle.shape, w.view.state)] = counts.get((w.handle.shape, w.view.state), 0) + 1
        self.metrics.workers.clear()
        for (shape, st), n in counts.items():
            self.metrics.workers.labels(shape, st).set(n)
        for m in self.cfg.models:
            ms = self.state.models.get(m.name)
            self.metrics.backoff.labels(m.name).set(max((ms.backoff_until - now) if ms else 0.0, 0.0))

    def route_table(self) -> dict[str, Any]:
        now = self.clock()
        models: dict[str, Any] = {}
        for m in self.cfg.models:
            ready, loading = [], 0
            for w in self.workers.values():
                if w.view.model != m.name:
                    continue
                if w.view.state == "ready" and w.state_body.get("engine_url"):
                    ready.append({
                        "worker_id": w.handle.id,
                        "url": w.state_body["engine_url"],
                        "served_model_name": w.state_body.get("served_model_name") or m.resolved_served_name,
                        "assignment_id": w.view.assignment_id,
                        "phases": w.state_body.get("phases") or {},
                    })
                elif w.view.state == "loading":
                    loading += 1
            ms = self.state.models.get(m.name)
            in_backoff = ms is not None and ms.backoff_until > now
            models[m.name] = {
                "served_name": m.resolved_served_name,
                "replicas": sorted(ready, key=lambda r: r["worker_id"]),
                "loading": loading,
                "failures": ms.failures if ms else 0,
                "error": ms.last_error if ms and ms.failures else None,
                "backoff_until": ms.backoff_until if ms and in_backoff else None,
            }
        return models

    async def _publish_routes(self) -> None:
        models = self.route_table()
        # Only the parts activators act on decide whether the version moves.
        def key(t: dict[str, Any]) -> Any:
            return {n: (tuple(r["url"] for r in v["replicas"]), v["loading"], v["failures"], v["error"],
                        v["backoff_until"] is not None) for n, v in t.items()}

        if key(models) != key(self.routes["models"]):
            async with self._routes_changed:
                self.routes = {"version": self.routes["version"] + 1, "models": models}
                self._routes_changed.notify_all()
        else:
            self.routes = {"version": self.routes["version"], "models": models}

    async def wait_routes(self, since: int, timeout_s: float) -> dict[str, Any]:
        """The route table once its version is past ``since`` (or after ``timeout_s``)."""
        async with self._routes_changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._routes_changed.wait_for(lambda: self.routes["version"] > since), timeout_s
                )
            return self.routes

    def status(self) -> dict[str, Any]:
        now = self.clock()
        act = self.activity(now)
        routes = self.route_table()
        models = []
        for m in self.cfg.models:
            reps: dict[str, int] = {}
            for w in self.workers.values():
                if w.view.model == m.name:
                    reps[w.view.state] = reps.get(w.view.state, 0) + 1
            a = act.get(m.name, ModelActivity())
            r = routes[m.name]
            models.append({
                "name": m.name, "served_name": m.resolved_served_name, "replicas": reps,
                "queued": a.queued, "in_flight": a.in_flight, "last_request_at": a.last_request_at,
                "error": r["error"], "backoff_until": r["backoff_until"],
                "last_cold_start": self.cold_starts.get(m.name),
            })
        workers = [{
            "id": w.handle.id, "shape": w.handle.shape, "state": w.view.state, "model": w.view.model,
            "assignment_id": w.view.assignment_id, "engine_url": w.state_body.get("engine_url"),
            "uptime_s": round(now - w.launched_at, 1), "error": w.view.error,
            "control_url": w.handle.control_url,
        } for w in sorted(self.workers.values(), key=lambda w: w.handle.id)]
        return {"now": now, "models": models, "workers": workers}
