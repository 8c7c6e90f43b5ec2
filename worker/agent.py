"""The worker agent: one per instance, hosting at most one engine at a time.

The agent owns the worker's facts (``worker.state.Facts``) and derives its state
from them in :meth:`Agent.record` only; nothing sets the state. It carries out the
controller's assignments itself and hands the other requests to parts of one job each,
which reach it through a small protocol each:

- ``worker.kept``: engines kept across models (built ahead, swapped into, parked);
- ``worker.sleep``: the asleep tier (sleep, and wake for the same model);
- ``worker.release``: releases (drain, then park or stop the engine);
- ``worker.adapters``: LoRA adapters in the engine it serves;
- ``worker.supervisor``: the engine host process kept standing by with vLLM
  imported (started, replaced, watched, restarted);
- ``worker.caches``: the weight-cache tiers (host memory, disk) the loader reads
  through and the status lists;
- ``worker.snapshots``: compile-cache snapshots restored before a compiled launch
  and captured after it;
- ``worker.engine_start``: the launch command, the engine's client and URL, and
  waiting for its ``/health``.

An assignment checks that the model is in the store, swaps it into a kept engine of its
class if there is one, else sends the launch to the engine host and polls the engine's
``/health`` until it answers. A failure stops the engine host at once and starts a
fresh one; the failure stays visible until a release clears it. An assignment of batch
work on a standby is preempted (``_preempt``) the moment an online assignment arrives.

Tasks (``worker.tasks``): host replacements run to completion even when whoever
asked for them is cancelled (a half-spawned engine host would be an orphan);
everything else (assignment, release, restarts after a crash) is cancelled on
shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from snapshotter.ops import StoreSnapshots
from thaw.aio import wait_event
from thaw.embedded_store import free_port
from thaw.log import get_logger
from thaw.s3uri import S3UriError, check_allowed
from thaw.telemetry import shutdown, tracing_from
from thaw.wire import AssignRequest, FailureKind, WorkerStatus
from weight_streaming.fetch import fetch_model_files
from worker.adapters import AdapterFetch, Adapters
from worker.caches import WeightCaches
from worker.engine_client import EngineClient, HttpEngineClient
from worker.engine_start import CurrentEngine, EngineClientFactory, launch_command, wait_healthy
from worker.errors import Conflict, Refused
from worker.front_end_files import FrontEndFetch, store_fetch
from worker.host import EngineHost, EngineHostProcess, OnEvent
from worker.kept import (
    ConfigReader,
    KeptEngines,
    ManifestReader,
    read_store_config,
    read_store_manifest,
)
from worker.launch import (
    EV_FAILED,
    EV_PARKED,
    EV_SWAP_FAILED,
    EV_SWAPPED,
    EV_WEIGHTS_LOADED,
    reported_kind,
)
from worker.load_trace import LoadTraces
from worker.metrics import WorkerMetrics
from worker.release import Releases
from worker.settings import AgentSettings
from worker.sleep import SleepMode
from worker.snapshots import EngineSnapshots, SnapshotOps
from worker.spare import SpareHost
from worker.state import Assignment, Facts, Prebuilt, WorkerState, derive_state, load_view
from worker.status import worker_status
from worker.supervisor import HostSpawner, HostSupervisor
from worker.tasks import Tasks

log = get_logger()


class Agent:
    def __init__(self, settings: AgentSettings, *, spawn_host: HostSpawner | None = None,
                 engine_client: EngineClientFactory = HttpEngineClient,
                 manifest_reader: ManifestReader = read_store_manifest, config_reader: ConfigReader = read_store_config,
                 snapshots: SnapshotOps | None = None, clock: Callable[[], float] = time.time,
                 adapter_fetch: AdapterFetch = fetch_model_files, front_end_fetch: FrontEndFetch | None = None) -> None:
        self.settings = settings
        self.metrics = WorkerMetrics()
        self._manifest_reader = manifest_reader
        self._clock = clock
        self.started_at = clock()
        self._facts = Facts()
        self._state = derive_state(self._facts)
        self._state_since = self.started_at
        # Each status given is numbered (WorkerStatus.seq): the controller drops one that
        # arrives after a later one.
        self._seq = itertools.count(1)
        self.metrics.set_state(self._state)
        self._tasks = Tasks()
        # Starts an engine host (a process group; see worker.host).
        self.spawn_engine_host: HostSpawner = spawn_host or partial(_spawn_engine_host_process, settings)
        # An engine host kept imported beside a batch assignment: the next assignment
        # (the one that preempts it) starts on it instead of waiting for vLLM's imports.
        self._spare: SpareHost | None = None
        self._supervisor = HostSupervisor(
            self, self._next_host, self._tasks,
            stop_grace_s=settings.host_stop_grace_s, restart_backoff_max_s=settings.host_restart_backoff_max_s,
            once=settings.packed)
        self._caches = WeightCaches(settings, self.metrics)
        self._snapshots = EngineSnapshots(settings, snapshots or StoreSnapshots(), facts=lambda: self._facts,
                                          record=self.record, clock=clock)
        self._engine = CurrentEngine(settings, engine_client)
        self.load_traces = LoadTraces(tracing_from(settings.telemetry, "thaw-worker"), settings.worker_id)
        self._assignment_task: asyncio.Task[None] | None = None
        # The request behind the engine now running (a wake-up must match it).
        self._launched: AssignRequest | None = None
        # Called after every state change (the heartbeat tells the controller at once).
        self.on_state_change: Callable[[], None] | None = None
        # Set whenever the facts change (see until).
        self._changed = asyncio.Event()
        # The packed engines this worker runs (worker.engines sets it), for the status.
        self.packed_engines: Callable[[], list[str]] = list
        # A packed engine: called once its release is done (it then goes away).
        self.on_released: Callable[[], None] | None = None
        # Its parts (see the module's docstring), each reaching the agent through its protocol.
        self.kept = KeptEngines(self, supervisor=self._supervisor, engine=self._engine, caches=self._caches,
                                clock=clock, manifest_reader=manifest_reader, config_reader=config_reader,
                                front_end_fetch=front_end_fetch or store_fetch(settings.store.client))
        self.releases = Releases(self, supervisor=self._supervisor, engine=self._engine, kept=self.kept, clock=clock)
        self.sleep_mode = SleepMode(self, engine=self._engine, drain=self.releases.drain, clock=clock)
        self.adapters = Adapters(self, clock=clock, fetch=adapter_fetch)

    # -- facts and the derived state ----------------------------------------------

    @property
    def state(self) -> WorkerState:
        return self._state

    @property
    def facts(self) -> Facts:
        return self._facts

    @property
    def engine(self) -> EngineClient | None:
        """The client of the engine the current assignment runs (None: none)."""
        return self._engine.client

    @property
    def launched(self) -> AssignRequest | None:
        """The assignment behind the engine now running."""
        return self._launched

    def spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        """Run ``coro`` as one of the agent's tasks (cancelled when it stops)."""
        return self._tasks.spawn(coro, name=name)

    def record(self, **changes: Any) -> None:
        """The one place facts change; logs and exports a state change."""
        adapters_before = self._facts.adapters
        self._facts = replace(self._facts, **changes)
        self._changed.set()
        if self._facts.adapters != adapters_before and self.on_state_change is not None:
            self.on_state_change()  # an adapter ready is a route: the controller hears of it at once
        new = derive_state(self._facts)
        if new is not self._state:
            a = self._facts.assignment
            log.info(
                "worker_state", state=new.value, previous=self._state.value,
                model=a.model if a else None, assignment_id=a.assignment_id if a else None,
                error=self._facts.failure if new is WorkerState.FAILED else None,
            )
            self._state, self._state_since = new, self._clock()
            self.metrics.set_state(new)
            if self.on_state_change is not None:
                self.on_state_change()

    def view(self) -> WorkerStatus:
        """The worker's status (``worker.status``)."""
        return worker_status(self.settings, self._facts, self._state, started_at=self.started_at,
                             state_since=self._state_since, engine_url=self._engine.url,
                             cached=self._caches.cached, load_bytes_per_s=dict(self._caches.load_rates),
                             engines=self.packed_engines(), adapters=self.adapters.views(), seq=next(self._seq))

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start the first engine host (returns at once; "imported" comes later)."""
        self._supervisor.replace()
        # Downloads and archives left by a previous agent that died mid-way.
        await asyncio.to_thread(shutil.rmtree, self.settings.snapshot_work_dir, True)
        await asyncio.to_thread(self._caches.open)
        await self.scan_caches()
        self._tasks.spawn(self._caches.scan_every(self.settings.cache_scan_interval_s), name="scan_caches")

    async def stop(self) -> None:
        """Cancel what is running, then stop the engine host and its whole group."""
        self._supervisor.shutting_down()
        await self._tasks.cancel_all()
        await self._supervisor.close(_graceful_stop_fits(self._facts))
        await self._engine.close()
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.close()
        await self._caches.close()
        await shutdown(self.load_traces.tracing)
        log.info("agent_stopped")

    async def scan_caches(self) -> list[Any]:
        """Look at what the weight caches hold now (the status lists it)."""
        return await self._caches.scan()

    # -- the engine host (worker.supervisor calls these) ------------------------------

    async def _next_host(self, on_event: OnEvent) -> EngineHost:
        """The next engine host: the spare kept beside a batch assignment, else a fresh one."""
        spare, self._spare = self._spare, None
        if spare is None:
            return await self.spawn_engine_host(on_event)
        host = await spare.take(on_event, refill=False)
        # Closed after the supervisor holds the host: the "imported" event the spare
        # replays must find it there.
        self._tasks.spawn(spare.close(), name="close_spare")
        return host

    def host_event(self, kind: str, event: dict[str, Any]) -> None:
        f = self._facts
        if kind == EV_WEIGHTS_LOADED:
            if f.assignment is not None and f.launched_at is not None and f.weights_loaded_at is None:
                report = event.get("load")
                lv = load_view(f.assignment.uri, report if isinstance(report, dict) else None)
                self._caches.note_load(lv)
                log.info("weights_loaded", assignment_id=f.assignment.assignment_id, model=f.assignment.model,
                         tier=lv.tier, seconds=lv.seconds, bytes=lv.bytes, sources=lv.sources)
                for r in (report.get("rejected") if isinstance(report, dict) else None) or []:
                    # A cached copy failed its check: it was evicted and read from elsewhere.
                    log.warning("cache_copy_rejected", assignment_id=f.assignment.assignment_id, **r)
                self.record(weights_loaded_at=float(event.get("t") or self._clock()), load=lv)
                self._tasks.spawn(self.scan_caches(), name="scan_caches_after_load")
        elif kind == EV_FAILED:
            if f.assignment is None and f.prebuilt is not None:
                self.host_unwell(f"building an engine failed: {event.get('error') or 'no reason given'}")
                self._supervisor.replace(graceful=False)
                return
            self.fail(f"engine failed to start: {event.get('error') or 'no reason given'}",
                      reported_kind(event.get("kind")))
        elif kind in (EV_SWAPPED, EV_SWAP_FAILED, EV_PARKED):
            self.kept.answer(event)

    def host_exited(self, facts: Facts, code: int, tail: str) -> None:
        if facts.assignment is None:
            self.host_unwell(f"engine host exited with status {code} while standing by: {tail}")
        elif facts.engine_ready_at is None:
            self.fail(f"engine exited with status {code} while loading: {tail}")
        else:
            self.fail(f"engine exited with status {code} while serving: {tail}")

    def host_gone(self) -> None:
        self.kept.host_gone()

    def host_unwell(self, reason: str) -> None:
        # Without an assignment there is nothing to stop; the failure is shown until
        # a release, so whoever manages the pool sees that this worker is unwell.
        if self._facts.failure is None and self._facts.release_requested_at is None:
            self.record(failure=reason)

    # -- assignments ----------------------------------------------------------------

    async def assign(self, req: AssignRequest) -> None:
        """Accept an assignment (raises :class:`Conflict` unless standing by).

        The same ``assignment_id`` again is accepted as a no-op (a retried request).
        Raises :class:`Refused` for a model URI outside ``settings.allowed_uri_prefixes``.
        """
        self.check_uri(req.uri, req.assignment_id)
        f = self._facts
        if (f.assignment is not None and f.assignment.assignment_id == req.assignment_id
                and f.release_requested_at is None):
            return
        if self._state is WorkerState.ASLEEP:
            self.sleep_mode.wake(req)
            return
        # A packed engine takes its one assignment while its engine host still imports.
        fresh = self.settings.packed and self._state is WorkerState.STARTING and f.failure is None
        if self.preemptible() and not req.batch:
            await self._preempt(req.assignment_id)
            spare, self._spare = self._spare, None  # preempted before its launch: not taken
            if spare is not None:
                self._tasks.spawn(spare.close(), name="close_spare")
        elif self._state is not WorkerState.STANDBY and not fresh:
            raise Conflict(f"worker is {self._state.value}, not standby; it takes an assignment only in standby",
                           self._state)
        self._launched = req
        a = Assignment(req.assignment_id, req.model, req.uri, req.served_model_name, self._clock(),
                       req.memory_bytes, req.revision, req.batch)
        if req.batch and not self.settings.packed and self._spare is None:
            self._spare = SpareHost(self.spawn_engine_host)
            self._spare.fill()
        self.record(assignment=a, snapshot_restored_at=None, snapshot=None, launched_at=None,
                    weights_loaded_at=None, engine_ready_at=None, failure=None, failure_kind=None, in_flight=None,
                    load=None)
        log.info("assignment_accepted", assignment_id=a.assignment_id, model=a.model, uri=a.uri)
        self._assignment_task = self._tasks.spawn(self._run_assignment(a, req), name="assignment")

    def preemptible(self) -> bool:
        """Its assignment is batch work another may take it from now (loading or serving, not releasing)."""
        f = self._facts
        return (f.assignment is not None and f.assignment.batch and f.release_requested_at is None
                and self._state in (WorkerState.LOADING, WorkerState.READY))

    async def _preempt(self, by: str) -> None:
        """Take the worker from its batch assignment now: no drain (the batch requests
        in flight are cut, and their activators give the lines back to run again), the
        engine host killed and the spare put in its place."""
        a = self._facts.assignment
        assert a is not None
        t0 = self._clock()
        self.record(release_requested_at=t0)
        # Shielded: a caller that goes away must not leave the release half done.
        await asyncio.shield(self._tasks.spawn(self.releases.run(False, 0.0), name="preempt"))
        took = self._clock() - t0
        self.metrics.preemption_seconds.observe(took)
        log.info("batch_preempted", assignment_id=a.assignment_id, model=a.model, by=by, seconds=round(took, 3))

    def check_uri(self, uri: str, what: str) -> None:
        if self.settings.allowed_uri_prefixes is not None:
            try:
                check_allowed(uri, self.settings.allowed_uri_prefixes)
            except S3UriError as exc:
                log.warning("assignment_refused", request=what, uri=uri, error=str(exc))
                raise Refused(f"refusing the assignment: model uri {exc}") from None

    async def _run_assignment(self, a: Assignment, req: AssignRequest) -> None:
        try:
            await self._load_and_serve(a, req)
        except Exception as exc:  # a bug or an unexpected OS error: visible, not stuck in loading
            log.exception("assignment_error", assignment_id=a.assignment_id)
            self.fail(f"internal error in the worker agent: {type(exc).__name__}: {exc}")

    async def _load_and_serve(self, a: Assignment, req: AssignRequest) -> None:
        s = self.settings
        store = s.store
        try:
            manifest = await asyncio.to_thread(self._manifest_reader, store, req.uri)
        except Exception as exc:
            self.fail(f"cannot read the model's manifest at {req.uri}: {exc}", "store")
            return
        if manifest is None:
            self.fail(f"no model at {req.uri} (no thaw-manifest.json: not pushed, or the push was interrupted)",
                      "store")
            return
        # An engine that may be kept (a class was named) or a kept one here: what the
        # model is to an engine decides between a swap and a build.
        ident = None
        if req.engine_class is not None or self._facts.prebuilt is not None:
            ident = await self.kept.identity(req.uri, manifest, req.engine, req.max_model_len)
        if self._facts.prebuilt is not None:
            if await self.kept.swap_if_it_fits(a, req, ident, manifest):
                await self._serve(a)
                return
            if self._facts.failure is not None:
                return
        cache_root = s.engine_cache_root(a.model)
        job = await self._snapshots.restore(a, req, manifest, store, cache_root)
        spare = self._spare
        if req.batch and spare is not None:
            # Batch waits for the spare's imports, so that they never compete with the
            # batch engine for the CPU and a preemption always finds the spare ready
            # (preempted before the launch, the standby's own host is still there).
            waited = self._clock()
            ok = await spare.wait_imported(s.load_timeout_s)
            log.info("batch_spare_ready" if ok else "batch_spare_not_ready", assignment_id=a.assignment_id,
                     waited_s=round(self._clock() - waited, 3))
        if not await self._host_standing_by():
            self.fail("the engine host went away before the launch")
            return
        host = self._supervisor.host
        assert host is not None
        port = free_port()
        # Kept (parked at release, swappable) only when the controller says so: a class
        # named in the assignment (one its pool pre-builds), and known here too.
        keep = ident if req.engine_class is not None else None
        cmd = launch_command(s, self._caches, req.uri, req.served_model_name, req.max_model_len, req.engine, port,
                             cache_root_of=a.model, sleep_mode=req.sleep_mode, swappable=keep is not None)
        engine = self._engine.at(port)
        self.record(launched_at=self._clock())
        try:
            await host.launch(cmd)
        except (BrokenPipeError, ConnectionResetError):
            return  # the engine host died: its watcher reports why
        if not await wait_healthy(engine, timeout_s=s.load_timeout_s, poll_s=s.ready_poll_s, clock=self._clock):
            self.fail(f"engine did not answer /health within {s.load_timeout_s:.0f} s of the launch")
            return
        now = self._clock()
        if keep is not None:
            # This engine can take another model of its class later (a release parks it).
            self.record(prebuilt=Prebuilt(keep.engine_class.id, keep.vocab, req.model, req.uri, port, now))
        self.record(engine_ready_at=now)
        self.metrics.engine_start.observe(now - a.assigned_at)
        f = self._facts
        log.info(
            "engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine.url,
            total_s=round(now - a.assigned_at, 3),
            launch_s=round((f.launched_at or now) - a.assigned_at, 3),
            weights_s=round(f.weights_loaded_at - (f.launched_at or now), 3) if f.weights_loaded_at else None,
            snapshot=f.snapshot.status if f.snapshot else None,
        )
        if job is not None:
            # Its own task: serving does not wait for it, and a release does not cancel it.
            self._tasks.spawn(self._snapshots.after_ready(a, job), name="snapshot_after_ready")
        await self._serve(a)

    async def _serve(self, a: Assignment) -> None:
        """While the assignment is ready: its in-flight count, for /state and the pool."""
        self.load_traces.ended(a, self._facts, self._clock())
        engine = self._engine.client
        while engine is not None:
            self.record(in_flight=await engine.in_flight())
            await asyncio.sleep(self.settings.in_flight_poll_s)

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()`` holds, judged again at every change of the facts (and
        every ``ready_poll_s``, for what is not a fact); False after ``timeout_s``."""
        deadline = self._clock() + timeout_s
        while not done():
            left = deadline - self._clock()
            if left <= 0:
                return False
            self._changed.clear()
            if done():
                return True
            await wait_event(self._changed, min(left, self.settings.ready_poll_s))
        return True

    async def _host_standing_by(self) -> bool:
        """Wait (up to the load timeout) for an engine host that can take a launch: one
        is being started when a kept engine of another class was just stopped."""
        def ready() -> bool:
            host = self._supervisor.host
            return (host is not None and self._facts.host_imported and not host.launched) \
                or self._facts.failure is not None

        return await self.until(ready, self.settings.load_timeout_s) and self._facts.failure is None

    def fail(self, reason: str, kind: FailureKind = "engine") -> None:
        """The current assignment failed: record why, stop its engine host (if it was
        launched) and start a fresh one. The first reason wins."""
        f = self._facts
        if f.failure is not None or f.release_requested_at is not None or f.assignment is None:
            return
        log.error("assignment_failed", assignment_id=f.assignment.assignment_id, model=f.assignment.model,
                  reason=reason)
        task = self._assignment_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        # Its engine (kept or not) is never served or swapped into again: it goes with
        # its engine host, and from now on is no longer offered.
        self.record(failure=reason, failure_kind=kind, in_flight=None, prebuilt=None, adapters=())
        self.load_traces.ended(f.assignment, self._facts, self._clock(), kind)
        self._tasks.spawn(self._engine.close(), name="close_engine")
        host = self._supervisor.host
        if host is not None and host.launched:
            self._supervisor.replace(graceful=False)

    async def stop_work(self) -> None:
        """Cancel the assignment's tasks (load or serving, a sleep or wake) and wait: a release's first step."""
        task = self._assignment_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.sleep_mode.cancel()

    def clear_assignment(self) -> None:
        """The assignment is gone: back to standing by (a release's last step)."""
        self._assignment_task = None
        self.sleep_mode.forget()
        self._launched = None
        self.record(assignment=None, snapshot_restored_at=None, snapshot=None, launched_at=None,
                     weights_loaded_at=None, engine_ready_at=None, release_requested_at=None, failure=None,
                     failure_kind=None,
                     in_flight=None, sleep_requested_at=None, woken_at=None, load=None, adapters=())


async def _spawn_engine_host_process(settings: AgentSettings, on_event: OnEvent) -> EngineHost:
    return await EngineHostProcess.spawn(on_event, log_level=settings.log_level, python=settings.python,
                                         preload=settings.engine_preload)


def _graceful_stop_fits(f: Facts) -> bool:
    """Whether stopping the engine host now deserves a graceful SIGTERM: it is
    standing by or serving (not loading, not failed)."""
    return f.failure is None and (f.launched_at is None or f.engine_ready_at is not None)
