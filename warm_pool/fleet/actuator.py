"""Carrying out the policy's decisions: through the providers (launch, stop, start,
terminate) and the workers' control API (:class:`~warm_pool.fleet.control.WorkerControl`:
assign, pack, release, sleep, prebuild, adapter loads and unloads).

Each decision is recorded as an event and, before its call is made, as a fact: an
intent the worker has not reflected yet (``warm_pool.fleet.view``), so the next tick does not
repeat it. The calls run as tasks; a worker's answer is taken in as its status, and a
refusal clears the intent (the next heartbeat is the truth). The providers' calls are
:class:`~warm_pool.fleet.machines.Machines`'.

Fenced (``warm_pool.fencing``): a provider call is made only after its action was written
under the actuator's term, and the workers' calls carry that term.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from thaw.config import Model, ThawConfig
from thaw.log import get_logger
from thaw.wire import (
    AdapterRequest,
    AdapterUnload,
    AssignRequest,
    PrebuildRequest,
    ReleaseRequest,
    SleepRequest,
    WorkerStatus,
)
from warm_pool.classes import ModelClasses, engine_bytes
from warm_pool.events import EventLog
from warm_pool.fencing import ActionLog
from warm_pool.fleet.control import ControlError, WorkerControl
from warm_pool.fleet.facts import FleetFacts
from warm_pool.fleet.machines import Machines, ShapeBackoff
from warm_pool.fleet.start_traces import StartTraces
from warm_pool.fleet.view import INTENT_TTL_S, Intent, count_states
from warm_pool.metrics import PoolMetrics
from warm_pool.policy.decide import (
    ModelActivity,
    Snapshot,
    WorkerView,
    kept_classes,
)
from warm_pool.policy.decisions import (
    Assign,
    Decision,
    Launch,
    LoadAdapter,
    Pack,
    Prebuild,
    Release,
    Sleep,
    Start,
    Stop,
    Terminate,
    UnloadAdapter,
    carry_out,
)
from warm_pool.providers.provider import Provider

log = get_logger()

@dataclass(frozen=True)
class At:
    """What the actuator carries a decision out with: the tick's snapshot and worker
    views, and its time."""

    snap: Snapshot
    views: dict[str, WorkerView]
    now: float


def decision_inputs(snap: Snapshot, views: Mapping[str, WorkerView], model: str | None,
                    shape: str | None) -> dict[str, Any]:
    """What led to a decision: the model's traffic and the worker states behind it."""
    out: dict[str, Any] = {}
    if model is not None:
        a = snap.activity.get(model, ModelActivity())
        out["activity"] = {"queued": a.queued, "in_flight": a.in_flight, "last_request_at": a.last_request_at}
        out["replicas"] = count_states(v.state for v in views.values() if v.model == model)
    if shape is not None:
        out["shape_workers"] = count_states(v.state for v in views.values() if v.shape == shape)
    return out


def assign_request(cfg: ThawConfig, model_classes: ModelClasses | None, model: Model, assignment_id: str,
                   revision: int | None) -> AssignRequest:
    """What a worker is asked to load ``model`` with."""
    return AssignRequest(
        assignment_id=assignment_id, model=model.name, uri=model.uri,
        served_model_name=model.resolved_served_name, max_model_len=model.max_context_tokens,
        # With vLLM's LoRA flags when it has adapters.
        engine=cfg.engine_args(model),
        # The asleep tier needs the engine started with sleep mode.
        sleep_mode=model.autoscaling.asleep_ttl_s > 0,
        # Named only for a model whose engine is kept (a class its pool pre-builds).
        engine_class=kept_classes(cfg, model_classes.classes).get(model.name) if model_classes else None,
        # Counted by a worker that packs engines (None: not counted).
        memory_bytes=engine_bytes(cfg, model_classes).get(model.name),
        revision=revision,
    )


class Actuator:
    """Carries out the policy's decisions (``warm_pool.policy.decisions.Executor``)."""

    def __init__(self, *, fleet: FleetFacts, providers: dict[str, Provider], control: WorkerControl,
                 config: Callable[[], ThawConfig], model_classes: ModelClasses | None, clock: Callable[[], float],
                 events: EventLog, metrics: PoolMetrics, wake: Callable[[], None],
                 refresh_soon: Callable[[], None],
                 revision_of: Callable[[str], int | None] = lambda model: None,
                 actions: ActionLog | None = None, traces: StartTraces | None = None) -> None:
        """``config``: the config in force; ``wake``: asks the loop to decide again (a
        call ended); ``refresh_soon``: asks the loop to list the providers' instances on
        its next turn (one was stopped or started); ``revision_of``: a model's current
        registry revision (what an assignment asks for); ``actions``: where provider
        actions are written before their calls (None: not written, not fenced);
        ``traces``: the traced requests waiting for models, whose traces the starts join."""
        self.fleet = fleet
        self.providers = providers
        self.control = control
        self._config = config
        self.model_classes = model_classes
        self.clock = clock
        self.events = events
        self.metrics = metrics
        self._wake = wake
        self._refresh_soon = refresh_soon
        self._revision_of = revision_of
        self.traces = traces or StartTraces(None, clock)
        self.machines = Machines(fleet=fleet, providers=providers, control=control, config=config, clock=clock,
                                 events=events, metrics=metrics, refresh_soon=refresh_soon, actions=actions)
        self._inflight_ops: set[asyncio.Task[None]] = set()

    @property
    def term(self) -> int | None:
        """The leader's term these decisions are carried out in (None: one controller
        leads alone); set when it takes the lease."""
        return self.machines.term

    @term.setter
    def term(self, term: int | None) -> None:
        self.machines.term = term

    @property
    def shape_backoff(self) -> dict[str, ShapeBackoff]:
        return self.machines.shape_backoff

    def launch_blocked_until(self, now: float) -> dict[str, float]:
        """The shapes backed off at ``now``, and until when."""
        return {s: b.until for s, b in self.shape_backoff.items() if b.until > now}

    async def settle(self) -> None:
        """Wait for the control calls and launches in flight."""
        while self._inflight_ops:
            await asyncio.gather(*list(self._inflight_ops), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel the calls in flight and wait for them to end."""
        for t in list(self._inflight_ops):
            t.cancel()
        await asyncio.gather(*self._inflight_ops, return_exceptions=True)

    # -- decisions: recorded, their intents noted, their calls started ----------------
    def carry_out(self, d: Decision, snap: Snapshot, views: dict[str, WorkerView], now: float) -> None:
        """Record ``d`` (an event, its intent) and start the call that carries it out."""
        kind = type(d).__name__.lower()
        reason = getattr(d, "reason", "demand")
        self.metrics.decisions.labels(kind, reason).inc()
        wid = getattr(d, "worker_id", None)
        model = getattr(d, "model", None)
        shape = d.shape if isinstance(d, Launch) else (views[wid].shape if wid in views else None)
        inputs = decision_inputs(snap, views, model, shape)
        if isinstance(d, Release) and d.for_model is not None:
            # An eviction: for which waiting model, and how long the evicted one was idle.
            inputs |= {"for_model": d.for_model, "idle_s": d.idle_s}
        self.events.record(kind, reason, decision=True, worker_id=wid, model=model, shape=shape, inputs=inputs)
        carry_out(d, self, At(snap, views, now))

    def launch(self, d: Launch, at: At) -> None:
        worker_id = f"w-{uuid.uuid4().hex[:10]}"
        self.fleet.observe(worker_id, d.shape, launch_requested_at=at.now)
        self._spawn(self.machines.launch(worker_id, d.shape), busy=worker_id)

    def assign(self, d: Assign, at: At) -> None:
        f = self.fleet.facts[d.worker_id]
        self.fleet.observe(d.worker_id, f.shape, intent=Intent("assign", at.now, d.model, d.assignment_id,
                                                               memory_bytes=at.snap.engine_bytes.get(d.model, 0),
                                                               revision=self._revision_of(d.model), batch=d.batch))
        self._spawn(self._assign(d), busy=d.worker_id)

    def load_adapter(self, d: LoadAdapter, at: At) -> None:
        self._adapter_intent(d, Intent("adapter_load", at.now, d.model, None), at.now)

    def unload_adapter(self, d: UnloadAdapter, at: At) -> None:
        self._adapter_intent(d, Intent("adapter_unload", at.now, d.model, None), at.now)

    def _adapter_intent(self, d: LoadAdapter | UnloadAdapter, intent: Intent, now: float) -> None:
        f = self.fleet.facts[d.worker_id]
        intents = tuple(i for i in f.adapter_intents if i.model != d.model and now - i.at < INTENT_TTL_S)
        self.fleet.observe(d.worker_id, f.shape, adapter_intents=(*intents, intent))
        self._spawn(self._adapter_call(d))

    def pack(self, d: Pack, at: At) -> None:
        f = self.fleet.facts[d.worker_id]
        self.fleet.observe(d.engine_id, f.shape, host=d.worker_id,
                           intent=Intent("assign", at.now, d.model, d.assignment_id, memory_bytes=d.memory_bytes,
                                         revision=self._revision_of(d.model)))
        self._spawn(self._pack(d), busy=d.engine_id)

    def release(self, d: Release, at: At) -> None:
        f = self.fleet.facts[d.worker_id]
        self.fleet.observe(d.worker_id, f.shape,
                           intent=Intent("release", at.now, d.model, at.views[d.worker_id].assignment_id))
        self._spawn(self._release(d.worker_id), busy=d.worker_id)

    def sleep(self, d: Sleep, at: At) -> None:
        f = self.fleet.facts[d.worker_id]
        self.fleet.observe(d.worker_id, f.shape,
                           intent=Intent("sleep", at.now, d.model, at.views[d.worker_id].assignment_id))
        self._spawn(self._sleep(d), busy=d.worker_id)

    def prebuild(self, d: Prebuild, at: At) -> None:
        f = self.fleet.facts[d.worker_id]
        self.fleet.observe(d.worker_id, f.shape, intent=Intent("prebuild", at.now, d.model, None, d.engine_class))
        self._spawn(self._prebuild(d), busy=d.worker_id)

    def stop(self, d: Stop, at: At) -> None:
        self.fleet.observe(d.worker_id, self.fleet.facts[d.worker_id].shape, intent=Intent("stop", at.now, None, None))
        self._spawn(self.machines.stop_or_start(d), busy=d.worker_id)

    def start(self, d: Start, at: At) -> None:
        self.fleet.observe(d.worker_id, self.fleet.facts[d.worker_id].shape, intent=Intent("start", at.now, None, None))
        self._spawn(self.machines.stop_or_start(d), busy=d.worker_id)

    def terminate(self, d: Terminate, at: At) -> None:
        f = self.fleet.facts.get(d.worker_id)
        if f is not None and f.host is not None:
            # A packed engine that stopped reporting: it has no instance to terminate.
            self.fleet.engine_gone(d.worker_id)
            return
        gone = self.fleet.terminating(d.worker_id)
        if gone is not None:
            self._spawn(self.machines.terminate(gone))

    def _spawn(self, coro: Coroutine[Any, Any, None], busy: str | None = None) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("pool_action_failed")
            finally:
                if busy:
                    self.fleet.busy.discard(busy)
                self._wake()

        if busy:
            self.fleet.busy.add(busy)
        task = asyncio.create_task(run())
        self._inflight_ops.add(task)
        task.add_done_callback(self._inflight_ops.discard)

    # -- the workers' control API -----------------------------------------------------
    def _control_failed(self, worker_id: str, what: str, exc: ControlError) -> None:
        f = self.fleet.facts.get(worker_id)
        if f is not None:
            self.fleet.observe(worker_id, f.shape, intent=None)  # the next heartbeat is the truth
        log.warning(f"{what}_refused", worker_id=worker_id, status=exc.status, error=str(exc))

    async def _call(self, worker_id: str, what: str,
                    call: Callable[[str], Awaitable[WorkerStatus]]) -> WorkerStatus | None:
        """One control call to a worker (``call(control_url)``); its answer is taken in as
        the worker's status. None when it did not take effect (logged, intent cleared)."""
        url = self.fleet.control_url(worker_id)
        if url is None:
            self._control_failed(worker_id, what, ControlError("no control URL yet"))
            return None
        try:
            status = await call(url)
        except ControlError as exc:
            self._control_failed(worker_id, what, exc)
            return None
        self.fleet.answered(worker_id, status)
        return status

    async def _assign(self, d: Assign) -> None:
        model = self._config().model(d.model)
        assert model is not None
        req = assign_request(self._config(), self.model_classes, model, d.assignment_id,
                             self._revision_of(model.name)).model_copy(update={"batch": d.batch})
        with self.traces.starting(model.name, "/assign", {"thaw.worker_id": d.worker_id,
                                                          "thaw.assignment_id": d.assignment_id,
                                                          "thaw.expected_tier": d.tier or ""}) as failed:
            answered = await self._call(d.worker_id, "assign", lambda url: self.control.assign(url, req))
            if answered is None:
                failed.append("control_failed")
        if answered is not None:
            log.info("worker_assigned", worker_id=d.worker_id, model=model.name, assignment_id=d.assignment_id,
                     expected_tier=d.tier, expected_load_s=d.expected_load_s, batch=d.batch)

    async def _pack(self, d: Pack) -> None:
        """Ask the worker for a packed engine; its answer is the new engine's status."""
        model = self._config().model(d.model)
        assert model is not None
        req = assign_request(self._config(), self.model_classes, model, d.assignment_id,
                             self._revision_of(model.name)).model_copy(
            update={"engine_id": d.engine_id, "memory_bytes": d.memory_bytes})
        url = self.fleet.control_url(d.worker_id)
        try:
            with self.traces.starting(model.name, "/engines", {"thaw.worker_id": d.worker_id,
                                                               "thaw.assignment_id": d.assignment_id,
                                                               "thaw.engine_id": d.engine_id}) as failed:
                try:
                    if url is None:
                        raise ControlError("no control URL yet")
                    status = await self.control.pack(url, req)
                except ControlError:
                    failed.append("control_failed")
                    raise
        except ControlError as exc:
            # Never started: the engine is forgotten, and this worker takes no other for a while.
            self.fleet.forget(d.engine_id)
            self.fleet.pack_refused(d.worker_id)
            log.warning("pack_refused", worker_id=d.worker_id, engine_id=d.engine_id, model=d.model,
                        status=exc.status, error=str(exc))
            self.events.record("pack", "refused", worker_id=d.worker_id, model=d.model, outcome="failed",
                               inputs={"error": str(exc), "memory_bytes": d.memory_bytes})
            return
        self.fleet.answered(d.engine_id, status)
        log.info("engine_packed", worker_id=d.worker_id, engine_id=d.engine_id, model=model.name,
                 assignment_id=d.assignment_id, memory_bytes=d.memory_bytes)

    async def _adapter_call(self, d: LoadAdapter | UnloadAdapter) -> None:
        """Load or unload an adapter; a refusal drops its intent (the status is the truth)."""
        model = self._config().model(d.model)
        url = self.fleet.control_url(d.worker_id)
        # An unload needs only the name (the model may have been removed since).
        if url is None or (model is None and isinstance(d, LoadAdapter)):
            return
        try:
            if isinstance(d, LoadAdapter):
                assert model is not None
                status = await self.control.load_adapter(url, AdapterRequest(
                    model=model.name, uri=model.uri, served_model_name=model.resolved_served_name))
            else:
                status = await self.control.unload_adapter(url, AdapterUnload(model=d.model))
        except ControlError as exc:
            f = self.fleet.facts.get(d.worker_id)
            if f is not None:
                self.fleet.observe(d.worker_id, f.shape,
                                   adapter_intents=tuple(i for i in f.adapter_intents if i.model != d.model))
            log.warning("adapter_call_refused", worker_id=d.worker_id, model=d.model, status=exc.status,
                        error=str(exc))
            return
        self.fleet.answered(d.worker_id, status)

    async def _prebuild(self, d: Prebuild) -> None:
        model = self._config().model(d.model)
        assert model is not None
        req = PrebuildRequest(model=model.name, uri=model.uri, served_model_name=model.resolved_served_name,
                              max_model_len=model.max_context_tokens, engine=model.engine,
                              engine_class=d.engine_class)
        await self._call(d.worker_id, "prebuild", lambda url: self.control.prebuild(url, req))

    async def _sleep(self, d: Sleep) -> None:
        url = self.fleet.control_url(d.worker_id)
        f = self.fleet.facts.get(d.worker_id)
        if url is None or f is None:
            return
        try:
            status = await self.control.sleep(url, SleepRequest(assignment_id=f.intent.assignment_id if f.intent else None))
        except ControlError as exc:
            # E.g. an engine started without sleep mode: release it rather than ask again.
            self._control_failed(d.worker_id, "sleep", exc)
            self.fleet.observe(d.worker_id, f.shape, intent=Intent("release", self.clock(), d.model,
                                                                   f.intent.assignment_id if f.intent else None))
            await self._release(d.worker_id)
            return
        self.fleet.answered(d.worker_id, status)

    async def _release(self, worker_id: str) -> None:
        url = self.fleet.control_url(worker_id)
        if url is None:
            return
        try:
            status = await self.control.release(url, ReleaseRequest(assignment_id=None, drain_timeout_s=30.0))
        except ControlError as exc:
            self._control_failed(worker_id, "release", exc)
            return
        self.fleet.answered(worker_id, status)
