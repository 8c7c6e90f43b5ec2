"""The worker agent: one per instance, hosting at most one engine at a time.

The agent owns the worker's facts (``worker.state.Facts``) and derives its state
from them in :meth:`Agent.record` only; nothing sets the state. It carries out the
controller's requests (assign, release, sleep) with parts of one job each:

- ``worker.supervisor``: the engine host process kept standing by with vLLM
  imported (started, replaced, watched, restarted);
- ``worker.caches``: the weight-cache tiers (host memory, disk) the loader reads
  through and the status lists;
- ``worker.snapshots``: compile-cache snapshots restored before a compiled launch
  and captured after it;
- ``worker.drain``: waiting for an engine to finish its requests.

An assignment checks that the model is in the store, sends the launch to the
engine host and polls the engine's ``/health`` until it answers; a release drains
the engine (``/metrics``: nothing running or waiting, twice in a row), stops the
engine host's process group and starts a fresh engine host for the next model. A
failure stops the engine host at once and starts a fresh one too; the failure stays
visible until a release clears it.

Engines kept across models (``pools[].prebuild``): standing by, the agent builds an
engine of a class it is asked for (``prebuild``); an assignment of a model of that
class (``worker.identity``: same class and vocabulary) swaps its weights into that
engine (``worker.swap_server`` in the engine host, ``worker.swap_core`` in the engine
core) instead of launching one; a release parks the drained engine (serving nothing,
prefix cache dropped) rather than stopping it, when the controller's assignment named
its class. A swap or park that fails marks the engine dirty: it is stopped and a fresh
host started, as for any failure. An assignment of batch work on a standby is
preempted (``_preempt``) the moment an online assignment arrives.

Tasks (``worker.tasks``): host replacements run to completion even when whoever
asked for them is cancelled (a half-spawned engine host would be an orphan);
everything else (assignment, release, restarts after a crash) is cancelled on
shutdown.

One piece: the agent's state machine; every transition is a method here, so what the
worker does on each request or event can be read in one place (its parts are modules of
their own, listed above).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, get_args

from snapshotter.ops import StoreSnapshots
from thaw.aio import wait_event
from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.log import get_logger
from thaw.objstore import S3Endpoint, read_model_config
from thaw.s3uri import S3UriError, check_allowed
from thaw.wire import (
    AssignRequest,
    FailureKind,
    LoadView,
    Phases,
    PrebuildRequest,
    PrebuiltView,
    ReleaseRequest,
    SleepRequest,
    WorkerStatus,
)
from weight_streaming.fetch import fetch_model_files
from weight_streaming.push import read_manifest
from worker.adapters import AdapterFetch, Adapters
from worker.caches import WeightCaches
from worker.drain import drain
from worker.engine_client import EngineClient, EngineError, HttpEngineClient
from worker.front_end_files import FrontEndFetch, front_end_dir, store_fetch
from worker.host import EngineHost, EngineHostProcess, OnEvent
from worker.identity import ModelIdentity, identity_of
from worker.launch import (
    EV_FAILED,
    EV_PARKED,
    EV_SWAP_FAILED,
    EV_SWAPPED,
    EV_WEIGHTS_LOADED,
    LaunchCommand,
    ParkCommand,
    SwapCommand,
    engine_env,
)
from worker.metrics import WorkerMetrics
from worker.settings import AgentSettings
from worker.snapshots import EngineSnapshots, SnapshotOps, snapshot_view
from worker.spare import SpareHost
from worker.state import Assignment, Facts, Prebuilt, WorkerState, derive_state, load_view
from worker.supervisor import HostSpawner, HostSupervisor
from worker.tasks import Tasks

log = get_logger()

EngineClientFactory = Callable[[str], EngineClient]
# Synchronous (boto3); the agent runs it in a thread. Returns None when there is no manifest.
ManifestReader = Callable[[S3Endpoint, str], object | None]
# The model's config.json (None: none). Synchronous, like the manifest reader.
ConfigReader = Callable[[S3Endpoint, str], dict[str, Any] | None]


class Conflict(Exception):
    """The request does not fit the worker's current state (HTTP 409)."""

    def __init__(self, message: str, state: WorkerState) -> None:
        super().__init__(message)
        self.state = state


class Refused(Exception):
    """A request this worker will never carry out, whatever its state (HTTP 403):
    e.g. a model URI outside the store prefixes its config allows."""


def read_store_manifest(store: S3Endpoint, uri: str) -> object | None:
    return read_manifest(store.client(), uri)


def read_store_config(store: S3Endpoint, uri: str) -> dict[str, Any] | None:
    return read_model_config(store.client(), uri)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        spawn_host: HostSpawner | None = None,
        engine_client: EngineClientFactory = HttpEngineClient,
        manifest_reader: ManifestReader = read_store_manifest,
        config_reader: ConfigReader = read_store_config,
        snapshots: SnapshotOps | None = None,
        clock: Callable[[], float] = time.time,
        adapter_fetch: AdapterFetch = fetch_model_files,
        front_end_fetch: FrontEndFetch | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = WorkerMetrics()
        self._engine_client = engine_client
        self._manifest_reader = manifest_reader
        self._config_reader = config_reader
        self._front_end_fetch = front_end_fetch or store_fetch(settings.store.client)
        self._clock = clock
        self.started_at = clock()
        self._facts = Facts()
        self._state = derive_state(self._facts)
        self._state_since = self.started_at
        self.metrics.set_state(self._state)
        self._tasks = Tasks()
        # Starts an engine host (a process group; see worker.host).
        self.spawn_engine_host: HostSpawner = spawn_host or self._spawn_engine_host_process
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
        self._engine: EngineClient | None = None
        self._engine_url: str | None = None
        self._assignment_task: asyncio.Task[None] | None = None
        # The request behind the engine now running (a wake-up must match it).
        self._launched: AssignRequest | None = None
        # Putting the engine to sleep, or waking it (one at a time: a wake waits for the sleep).
        self._sleep_task: asyncio.Task[None] | None = None
        self._wake_task: asyncio.Task[None] | None = None
        # Called after every state change (the heartbeat tells the controller at once).
        self.on_state_change: Callable[[], None] | None = None
        # Swap and park commands waiting for their event, by swap id.
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # Set whenever the facts change (see _until).
        self._changed = asyncio.Event()
        # The packed engines this worker runs (worker.engines sets it), for the status.
        self.packed_engines: Callable[[], list[str]] = list
        # A packed engine: called once its release is done (it then goes away).
        self.on_released: Callable[[], None] | None = None
        # LoRA adapters in the engine it serves (worker.adapters).
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
        return self._engine

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
        f, s = self._facts, self.settings
        a = f.assignment
        return WorkerStatus(
            worker_id=s.worker_id,
            instance_id=s.instance_id or s.worker_id,
            shape=s.shape,
            control_url=s.control_url,
            state=self._state,
            model=a.model if a else None,
            assignment_id=a.assignment_id if a else None,
            revision=a.revision if a else None,
            batch=a.batch if a else False,
            served_model_name=a.served_model_name if a else None,
            engine_url=self._engine_url if self._state is WorkerState.READY else None,
            started_at=self.started_at,
            state_since=self._state_since,
            phases=Phases(
                assigned=a.assigned_at if a else None,
                # When the restore finished, or was skipped (then it took no time).
                snapshot_restored=f.snapshot_restored_at if a else None,
                weights_loaded=f.weights_loaded_at if a else None,
                engine_ready=f.engine_ready_at if a else None,
                woken=f.woken_at if a else None,
            ),
            snapshot=snapshot_view(f.snapshot) if a and f.snapshot else None,
            error=f.failure,
            failure_kind=_kind(f.failure_kind) if f.failure is not None else None,
            in_flight=f.in_flight,
            load=f.load if a else None,
            cached=self._caches.cached,
            load_bytes_per_s=dict(self._caches.load_rates),
            prebuilt=_prebuilt_view(f.prebuilt),
            memory_bytes=a.memory_bytes if a else None,
            capacity_bytes=s.capacity_bytes or None,
            host_worker_id=s.host_worker_id,
            engines=self.packed_engines(),
            adapters=self.adapters.views(),
        )

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
        await self._supervisor.close(self._graceful_stop_fits())
        await self._close_engine()
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.close()
        await self._caches.close()
        log.info("agent_stopped")

    async def scan_caches(self) -> list[Any]:
        """Look at what the weight caches hold now (the status lists it)."""
        return await self._caches.scan()

    # -- the engine host (worker.supervisor calls these) ------------------------------

    async def _next_host(self, on_event: OnEvent) -> EngineHost:
        """The next engine host: the spare kept beside a batch assignment when there is
        one, else a fresh one."""
        spare, self._spare = self._spare, None
        if spare is None:
            return await self.spawn_engine_host(on_event)
        host = await spare.take(on_event, refill=False)
        # Closed after the supervisor holds the host: the "imported" event the spare
        # replays must find it there.
        self._tasks.spawn(spare.close(), name="close_spare")
        return host

    async def _spawn_engine_host_process(self, on_event: OnEvent) -> EngineHost:
        return await EngineHostProcess.spawn(on_event, log_level=self.settings.log_level,
                                             python=self.settings.python, preload=self.settings.engine_preload)

    def _graceful_stop_fits(self) -> bool:
        """Whether stopping the engine host now deserves a graceful SIGTERM: it is
        standing by or serving (not loading, not failed)."""
        f = self._facts
        return f.failure is None and (f.launched_at is None or f.engine_ready_at is not None)

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
            self._fail(f"engine failed to start: {event.get('error') or 'no reason given'}",
                       _kind(event.get("kind")))
        elif kind in (EV_SWAPPED, EV_SWAP_FAILED, EV_PARKED):
            waiter = self._waiters.pop(str(event.get("swap_id")), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event)

    def host_exited(self, facts: Facts, code: int, tail: str) -> None:
        if facts.assignment is None:
            self.host_unwell(f"engine host exited with status {code} while standing by: {tail}")
        elif facts.engine_ready_at is None:
            self._fail(f"engine exited with status {code} while loading: {tail}")
        else:
            self._fail(f"engine exited with status {code} while serving: {tail}")

    def host_gone(self) -> None:
        """The engine host stopped or exited: the engine it kept goes with it, and a
        swap or park waiting for it gets its answer now."""
        if self._facts.prebuilt is not None:
            self.record(prebuilt=None)
        for swap_id, waiter in list(self._waiters.items()):
            if not waiter.done():
                waiter.set_result({"event": EV_SWAP_FAILED, "swap_id": swap_id, "kind": "engine",
                                   "error": "the engine host exited"})
        self._waiters.clear()

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
            self._wake(req)
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
        """Its assignment is batch work that another assignment may take it from now
        (loading or serving, not already being released)."""
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
        await asyncio.shield(self._tasks.spawn(self._run_release(False, 0.0), name="preempt"))
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
            self._fail(f"internal error in the worker agent: {type(exc).__name__}: {exc}")

    async def _load_and_serve(self, a: Assignment, req: AssignRequest) -> None:
        s = self.settings
        store = s.store
        try:
            manifest = await asyncio.to_thread(self._manifest_reader, store, req.uri)
        except Exception as exc:
            self._fail(f"cannot read the model's manifest at {req.uri}: {exc}", "store")
            return
        if manifest is None:
            self._fail(f"no model at {req.uri} (no thaw-manifest.json: not pushed, or the push was interrupted)",
                       "store")
            return
        # An engine that may be kept (a class was named) or a kept one here: what the
        # model is to an engine decides between a swap and a build.
        ident = None
        if req.engine_class is not None or self._facts.prebuilt is not None:
            ident = await self._identity(req.uri, manifest, req.engine, req.max_model_len)
        if self._facts.prebuilt is not None:
            if await self._swap_if_it_fits(a, req, ident, manifest):
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
            self._fail("the engine host went away before the launch")
            return
        host = self._supervisor.host
        assert host is not None
        port = free_port()
        # Kept (parked at release, swappable) only when the controller says so: a class
        # named in the assignment (one its pool pre-builds), and known here too.
        keep = ident if req.engine_class is not None else None
        cmd = self._launch_command(req.uri, req.served_model_name, req.max_model_len, req.engine, port,
                                   cache_root_of=a.model, sleep_mode=req.sleep_mode, swappable=keep is not None)
        self._engine_url = f"http://{s.advertised}:{port}"  # for the routes
        self._engine = engine = self._engine_client(f"http://{s.local}:{port}")
        self.record(launched_at=self._clock())
        try:
            await host.launch(cmd)
        except (BrokenPipeError, ConnectionResetError):
            return  # the engine host died: its watcher reports why
        if not await self._wait_healthy(engine):
            self._fail(f"engine did not answer /health within {s.load_timeout_s:.0f} s of the launch")
            return
        now = self._clock()
        if keep is not None:
            # This engine can take another model of its class later (a release parks it).
            self.record(prebuilt=Prebuilt(keep.engine_class.id, keep.vocab, req.model, req.uri, port, now))
        self.record(engine_ready_at=now)
        self.metrics.engine_start.observe(now - a.assigned_at)
        f = self._facts
        log.info(
            "engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine_url,
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
        engine = self._engine
        while engine is not None:
            self.record(in_flight=await engine.in_flight())
            await asyncio.sleep(self.settings.in_flight_poll_s)

    def _launch_command(self, uri: str, served_model_name: str, max_model_len: int, engine: EngineArgs, port: int,
                        *, cache_root_of: str, sleep_mode: bool = False, swappable: bool = False,
                        serving: bool = True) -> LaunchCommand:
        s = self.settings
        cache_root = s.engine_cache_root(cache_root_of)
        return LaunchCommand(
            uri=uri, served_model_name=served_model_name, max_model_len=max_model_len,
            engine=self._caches.loader_args(engine), port=port, host=s.host, sleep_mode=sleep_mode,
            swappable=swappable, serving=serving,
            env=engine_env(engine, s.store.env(), str(s.data_dir), cache_root=str(cache_root),
                           assets_dir=str(s.engine_assets_dir), sleep_mode=sleep_mode),
        )

    async def _wait_healthy(self, engine: EngineClient) -> bool:
        s = self.settings
        deadline = self._clock() + s.load_timeout_s
        while not await engine.healthy():
            if self._clock() > deadline:
                return False
            await asyncio.sleep(s.ready_poll_s)
        return True

    async def _until(self, done: Callable[[], bool], timeout_s: float) -> bool:
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

        return await self._until(ready, self.settings.load_timeout_s) and self._facts.failure is None

    async def _identity(self, uri: str, manifest: object, engine: EngineArgs,
                        max_model_len: int) -> ModelIdentity | None:
        """What the model is to a kept engine; None (no swap, nothing kept) when its
        config cannot be read: the model is then built as any other."""
        try:
            config = await asyncio.to_thread(self._config_reader, self.settings.store, uri)
            return identity_of(manifest, config, engine, max_model_len)
        except Exception as exc:
            log.warning("engine_class_unknown", uri=uri, error=f"{type(exc).__name__}: {exc}")
            return None

    # -- kept engines: pre-built, swapped into, parked ------------------------------------

    async def prebuild(self, req: PrebuildRequest) -> bool:
        """Build an engine of ``req.model``'s class while standing by; False when this
        worker already keeps one of that class. Raises :class:`Conflict` unless
        standing by with no engine, :class:`Refused` for a URI outside the allowed
        prefixes."""
        self.check_uri(req.uri, req.model)
        f = self._facts
        if f.prebuilt is not None and f.prebuilt.engine_class == req.engine_class:
            return False
        host = self._supervisor.host
        if self._state is not WorkerState.STANDBY or f.prebuilt is not None or host is None or host.launched:
            raise Conflict(f"worker is {self._state.value}"
                           + (" and keeps an engine already" if f.prebuilt is not None else "")
                           + "; it builds an engine only standing by with none", self._state)
        self.record(prebuilt=Prebuilt(req.engine_class, "", req.model, req.uri, 0, None))
        log.info("prebuild_accepted", model=req.model, engine_class=req.engine_class)
        self._tasks.spawn(self._run_prebuild(req), name="prebuild")
        return True

    async def _run_prebuild(self, req: PrebuildRequest) -> None:
        s = self.settings
        t0 = self._clock()
        try:
            manifest = await asyncio.to_thread(self._manifest_reader, s.store, req.uri)
        except Exception as exc:
            manifest = None
            log.warning("prebuild_manifest_unreadable", uri=req.uri, error=str(exc))
        ident = await self._identity(req.uri, manifest, req.engine, req.max_model_len) if manifest else None
        host = self._supervisor.host
        p = self._facts.prebuilt
        if ident is None or host is None or host.launched or p is None or p.built_at is not None:
            self.record(prebuilt=None)
            self.host_unwell(f"cannot build an engine for {req.model}: "
                             + ("its manifest or config.json could not be read" if ident is None
                                else "the engine host is not standing by"))
            return
        if ident.engine_class.id != req.engine_class:
            # The controller's view of the model is older than the store's: ours counts.
            log.warning("engine_class_differs", model=req.model, controller=req.engine_class,
                        worker=ident.engine_class.id)
        port = free_port()
        cmd = self._launch_command(req.uri, f"thaw-prebuilt-{ident.engine_class.id}", req.max_model_len, req.engine,
                                   port, cache_root_of=req.model, swappable=True, serving=False)
        self.record(prebuilt=replace(p, engine_class=ident.engine_class.id, vocab=ident.vocab, port=port))
        self._engine_url = f"http://{s.advertised}:{port}"
        self._engine = engine = self._engine_client(f"http://{s.local}:{port}")
        try:
            await host.launch(cmd)
        except (BrokenPipeError, ConnectionResetError):
            return  # the engine host died: its watcher reports why
        if not await self._wait_healthy(engine):
            if self._facts.prebuilt is not None:
                self.host_unwell(f"the engine built for {req.model} did not answer /health within "
                                 f"{s.load_timeout_s:.0f} s")
                self._supervisor.replace(graceful=False)
            return
        p = self._facts.prebuilt
        if p is not None and p.port == port:
            now = self._clock()
            self.record(prebuilt=replace(p, built_at=now))
            self.metrics.engine_start.observe(now - t0)
            log.info("engine_prebuilt", model=req.model, engine_class=ident.engine_class.id,
                     seconds=round(now - t0, 3))

    async def _swap_if_it_fits(self, a: Assignment, req: AssignRequest, ident: ModelIdentity | None,
                               manifest: object = None) -> bool:
        """Swap the model into the kept engine when it is of its class (waiting for one
        still being built); else stop that engine (a fresh engine host follows) and
        return False. A swap that fails fails the assignment (returns False)."""
        s = self.settings
        await self._until(lambda: self._facts.prebuilt is None or self._facts.prebuilt.built_at is not None,
                          s.load_timeout_s)
        p = self._facts.prebuilt
        if p is None:
            return False
        fits = (ident is not None and p.built_at is not None
                and (ident.engine_class.id, ident.vocab) == (p.engine_class, p.vocab))
        if not fits:
            why = ("its class is unknown" if ident is None else "the engine is not built" if p.built_at is None
                   else f"vocabulary files differ from {p.model}'s" if ident.engine_class.id == p.engine_class
                   else f"another engine class ({ident.engine_class.id} != {p.engine_class})")
            log.info("kept_engine_replaced", assignment_id=a.assignment_id, model=a.model, kept=p.model, reason=why)
            await self._supervisor.replace(graceful=False)
            return False
        engine = self._engine
        if engine is None:
            self._engine = engine = self._engine_client(f"http://{s.local}:{p.port}")
        self._engine_url = f"http://{s.advertised}:{p.port}"
        now = self._clock()
        self.record(snapshot_restored_at=now, launched_at=now)
        extra = self._caches.loader_args(req.engine).extra.get("model_loader_extra_config") or {}
        files = await front_end_dir(s.data_dir / "model-files", self._front_end_fetch, req.uri, manifest)
        ev = await self._command(SwapCommand(swap_id=a.assignment_id, uri=req.uri,
                                             served_model_name=req.served_model_name, loader_options=extra,
                                             files_dir=files))
        if ev.get("event") != EV_SWAPPED:
            self._fail(f"swapping the model into the engine failed ({ev.get('kind', 'engine')}): "
                       f"{ev.get('error') or 'no reason given'}", _kind(ev.get("cause")))
            return False
        report, steps = ev.get("load"), ev.get("seconds")
        lv = load_view(req.uri, report if isinstance(report, dict) else None,
                       swap_steps=steps if isinstance(steps, dict) else {})
        self._caches.note_load(lv)
        self._tasks.spawn(self.scan_caches(), name="scan_caches_after_swap")
        self.record(weights_loaded_at=float(ev.get("t") or self._clock()), load=lv,
                    prebuilt=replace(p, model=req.model, uri=req.uri))
        if not await self._wait_healthy(engine):
            self._fail("the engine did not answer /health after the swap")
            return False
        now = self._clock()
        self.record(engine_ready_at=now)
        self.metrics.engine_start.observe(now - a.assigned_at)
        log.info("engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine_url,
                 total_s=round(now - a.assigned_at, 3), swap=True, tier=lv.tier, steps_s=ev.get("seconds"))
        return True

    async def _command(self, cmd: SwapCommand | ParkCommand) -> dict[str, Any]:
        """Send a command to the engine host; its answering event (a swap_failed of kind
        "engine" when the host is gone or does not answer within the load timeout)."""
        host = self._supervisor.host
        if host is None or host.returncode is not None:
            return {"event": EV_SWAP_FAILED, "kind": "engine", "error": "no engine host"}
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[cmd.swap_id] = waiter
        try:
            await host.command(cmd)
            return await asyncio.wait_for(waiter, self.settings.load_timeout_s)
        except (BrokenPipeError, ConnectionResetError):
            return {"event": EV_SWAP_FAILED, "kind": "engine", "error": "the engine host exited"}
        except TimeoutError:
            return {"event": EV_SWAP_FAILED, "kind": "engine",
                    "error": f"no answer within {self.settings.load_timeout_s:.0f} s"}
        finally:
            self._waiters.pop(cmd.swap_id, None)

    def _fail(self, reason: str, kind: FailureKind = "engine") -> None:
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
        self._tasks.spawn(self._close_engine(), name="close_engine")
        host = self._supervisor.host
        if host is not None and host.launched:
            self._supervisor.replace(graceful=False)

    async def _close_engine(self) -> None:
        engine, self._engine, self._engine_url = self._engine, None, None
        if engine is not None:
            await engine.aclose()

    async def _drain(self, engine: EngineClient, timeout_s: float) -> None:
        def gone() -> bool:
            host = self._supervisor.host
            return host is None or host.returncode is not None

        await drain(engine, timeout_s, poll_s=self.settings.drain_poll_s, clock=self._clock,
                    on_in_flight=lambda n: self.record(in_flight=n), engine_gone=gone)

    # -- the asleep tier (vLLM sleep mode) -----------------------------------------------

    async def sleep(self, req: SleepRequest) -> bool:
        """Put the ready engine to sleep, keeping the model; False if it already is.

        The worker is ``asleep`` at once (the pool manager routes nothing to it); the
        engine drains, then sleeps. The next assignment of the same model wakes it.
        """
        f = self._facts
        if f.assignment is None or self._state not in (WorkerState.READY, WorkerState.ASLEEP):
            raise Conflict(f"worker is {self._state.value}; only a ready engine can be put to sleep", self._state)
        if req.assignment_id is not None and req.assignment_id != f.assignment.assignment_id:
            raise Conflict(
                f"assignment {req.assignment_id!r} is not the current one ({f.assignment.assignment_id!r})",
                self._state,
            )
        if self._state is WorkerState.ASLEEP:
            return False
        if self._launched is None or not self._launched.sleep_mode:
            raise Conflict("the engine was not started with sleep mode (sleep_mode in the assignment)", self._state)
        log.info("sleep", assignment_id=f.assignment.assignment_id, level=req.level)
        self.record(sleep_requested_at=self._clock())
        self._sleep_task = self._tasks.spawn(self._run_sleep(req), name="sleep")
        return True

    async def _run_sleep(self, req: SleepRequest) -> None:
        engine = self._engine
        if engine is None:
            return
        await self._drain(engine, req.drain_timeout_s)
        t0 = self._clock()
        try:
            await engine.sleep(req.level)
        except EngineError as exc:
            self._fail(f"putting the engine to sleep failed: {exc}")
            return
        self.metrics.sleep_seconds.observe(self._clock() - t0)
        log.info("engine_asleep", level=req.level, seconds=round(self._clock() - t0, 3))

    def _wake(self, req: AssignRequest) -> None:
        """An assignment for the model asleep here: wake the engine instead of loading."""
        launched, cur = self._launched, self._facts.assignment
        assert launched is not None and cur is not None
        same = (req.model, req.uri, req.served_model_name, req.max_model_len, req.engine) == (
            launched.model, launched.uri, launched.served_model_name, launched.max_model_len, launched.engine)
        if not same:
            raise Conflict(f"worker is asleep with model {cur.model!r} ({cur.uri}); release it before "
                           f"assigning another model or other engine settings", self._state)
        a = Assignment(req.assignment_id, req.model, req.uri, req.served_model_name, self._clock(),
                       revision=req.revision)
        self.record(assignment=a, sleep_requested_at=None, snapshot_restored_at=None, snapshot=None,
                     launched_at=None, weights_loaded_at=None, engine_ready_at=None, woken_at=None,
                     failure=None, failure_kind=None, load=LoadView(tier="asleep"))
        log.info("assignment_accepted", assignment_id=a.assignment_id, model=a.model, uri=a.uri, wake=True)
        self._wake_task = self._tasks.spawn(self._run_wake(a), name="wake")

    async def _run_wake(self, a: Assignment) -> None:
        sleeping = self._sleep_task
        if sleeping is not None:
            await asyncio.gather(sleeping, return_exceptions=True)  # still going to sleep
        engine = self._engine
        if self._facts.failure is not None or self._facts.assignment != a:
            return
        if engine is None:
            self._fail("the engine went away while asleep")
            return
        try:
            await engine.wake_up()
        except EngineError as exc:
            if self._facts.assignment == a:
                self._fail(f"waking the engine failed: {exc}")
            return
        if self._facts.assignment != a:
            return  # released meanwhile
        now = self._clock()
        self.record(engine_ready_at=now, woken_at=now)
        self.metrics.engine_start.observe(now - a.assigned_at)
        log.info("engine_ready", assignment_id=a.assignment_id, model=a.model, engine_url=self._engine_url,
                 total_s=round(now - a.assigned_at, 3), woken=True)

    # -- releases ---------------------------------------------------------------------

    async def release(self, req: ReleaseRequest) -> bool:
        """Start releasing the current assignment; False when there was nothing to do.

        Raises :class:`Conflict` for an ``assignment_id`` that is not the current one.
        """
        f = self._facts
        if f.assignment is None:
            if f.failure is not None:  # an engine host failed while standing by
                self.record(failure=None, failure_kind=None)
                return True
            return False
        if req.assignment_id is not None and req.assignment_id != f.assignment.assignment_id:
            raise Conflict(
                f"assignment {req.assignment_id!r} is not the current one ({f.assignment.assignment_id!r})",
                self._state,
            )
        if f.release_requested_at is not None:
            return True  # already releasing
        if f.failure is not None:
            # The failed engine host is already being replaced (if it was launched).
            log.info("release", assignment_id=f.assignment.assignment_id, from_state="failed")
            if self.settings.packed:
                self.record(release_requested_at=self._clock())
                self._tasks.spawn(self._run_release(False, 0.0), name="release")
                return True
            self._clear_assignment()
            return True
        drain = self._state is WorkerState.READY  # else loading: abort
        log.info("release", assignment_id=f.assignment.assignment_id, from_state=self._state.value,
                 drain_timeout_s=req.drain_timeout_s)
        self.record(release_requested_at=self._clock())
        self._tasks.spawn(self._run_release(drain, req.drain_timeout_s), name="release")
        return True

    async def _run_release(self, drain: bool, drain_timeout_s: float) -> None:
        for task in (self._assignment_task, self._sleep_task, self._wake_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        engine = self._engine
        if drain and engine is not None:
            await self._drain(engine, drain_timeout_s)
        if self.settings.packed:
            # A packed engine goes away with its assignment: no engine host follows.
            await self._close_engine()
            await self._supervisor.close(graceful=drain)
            self._clear_assignment()
            if self.on_released is not None:
                self.on_released()
            return
        if drain and await self._park():
            # The engine stays, parked, for the next model of its class.
            await self.scan_caches()
            self._clear_assignment()
            return
        await self._close_engine()
        host = self._supervisor.host
        if host is None or host.launched:
            await self._supervisor.replace(graceful=drain)
        # Before standby is reported: the controller places the next model by it.
        await self.scan_caches()
        self._clear_assignment()

    async def _park(self) -> bool:
        """Keep a drained engine that can take another model (it came from a kept
        engine or was started swappable): it stops serving and drops its prefix cache.
        False when there is none to keep, or parking failed (the engine then goes)."""
        f, host = self._facts, self._supervisor.host
        p = f.prebuilt
        if p is None or p.built_at is None or f.assignment is None or host is None or host.returncode is not None:
            return False
        ev = await self._command(ParkCommand(swap_id=f"park-{f.assignment.assignment_id}"))
        if ev.get("event") != EV_PARKED:
            log.warning("park_failed", assignment_id=f.assignment.assignment_id, kind=ev.get("kind"),
                        error=ev.get("error"))
            return False
        steps = ev.get("seconds") if isinstance(ev.get("seconds"), dict) else None
        self.record(prebuilt=replace(p, park_steps_s=steps))
        log.info("engine_parked", assignment_id=f.assignment.assignment_id, model=p.model,
                 engine_class=p.engine_class, steps_s=steps)
        return True

    def _clear_assignment(self) -> None:
        self._assignment_task = None
        self._sleep_task = self._wake_task = None
        self._launched = None
        self.record(assignment=None, snapshot_restored_at=None, snapshot=None, launched_at=None,
                     weights_loaded_at=None, engine_ready_at=None, release_requested_at=None, failure=None,
                     failure_kind=None,
                     in_flight=None, sleep_requested_at=None, woken_at=None, load=None, adapters=())


def _kind(value: object) -> FailureKind:
    """A failure kind an engine host reported (anything else, or none: "engine")."""
    return value if value in get_args(FailureKind) else "engine"  # type: ignore[return-value]


def _prebuilt_view(p: Prebuilt | None) -> PrebuiltView | None:
    if p is None:
        return None
    return PrebuiltView(engine_class=p.engine_class, model=p.model, state="ready" if p.built_at else "building",
                        built_at=p.built_at, park_steps_s=dict(p.park_steps_s) if p.park_steps_s else None)
