"""The worker agent: one per instance, hosting at most one engine at a time.

It keeps one engine host process standing by (vLLM imported, see
``worker.engine_host``). An assignment checks that the model is in the store,
sends the launch to that engine host and polls the engine's ``/health`` until it
answers; a release drains the engine (``/metrics``: nothing running or waiting,
twice in a row), stops the engine host's process group and starts a fresh engine
host for the next model. A failure stops the engine host at once and starts a fresh
one too; the failure stays visible until a release clears it.

Local copies of weights (the shape's ``cache`` and ``host_cache_gib``): a launch with
Thaw's loader reads through a host-memory tier (a tmpfs directory of this worker's
own) and a disk tier, fastest first, and fills the tiers that missed as the weights
stream (``weight_streaming.s3_loader``). The agent looks at the tiers every few
seconds and after each load and release, and its status lists the models they hold
(``cached``), which the controller's placement reads. The host tier is emptied when
the agent stops: it is memory.

Engine snapshots (``snapshotter``): before a compiled-mode launch the agent restores
the model's compile caches for its fingerprint from the store into the engine's cache
root (``phases.snapshot_restored`` ends then); once the engine is ready it counts the
kernels the engine compiled anyway and, when there was no usable snapshot, captures
one in the background. A snapshot only ever makes a start faster: any problem with
one is logged and the engine builds its caches as usual.

The state is never set: the agent records facts (``worker.state.Facts``) and
derives the state from them, in :meth:`Agent._update` only.

Tasks: host replacements run to completion even when whoever asked for them is
cancelled (a half-spawned engine host would be an orphan); everything else
(assignment, release, restarts after a crash) is cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from snapshotter.archive import kernel_files
from snapshotter.fingerprint import Fingerprint, fingerprint_inputs, fingerprint_of
from snapshotter.ops import (
    CAPTURE_AFTER,
    CaptureResult,
    CaptureStatus,
    RestoreResult,
    RestoreStatus,
    StoreSnapshots,
)
from snapshotter.store import SnapshotLocation
from thaw.config import EngineArgs
from thaw.embedded_store import free_port
from thaw.log import get_logger
from thaw.objstore import S3Endpoint
from thaw.s3uri import S3UriError, check_allowed
from thaw.wire import (
    AssignRequest,
    CachedWeights,
    LoadView,
    Phases,
    ReleaseRequest,
    SleepRequest,
    SnapshotView,
    WorkerStatus,
)
from weight_streaming.cache import DiskCache
from weight_streaming.manifest import Manifest
from weight_streaming.push import read_manifest
from worker.engine_client import EngineClient, EngineError, HttpEngineClient
from worker.host import EngineHost, EngineHostProcess, OnEvent
from worker.launch import (
    EV_FAILED,
    EV_IMPORTED,
    EV_WEIGHTS_LOADED,
    LaunchCommand,
    engine_env,
)
from worker.metrics import WorkerMetrics
from worker.settings import AgentSettings
from worker.state import Assignment, Facts, SnapshotFacts, WorkerState, derive_state, load_view

log = get_logger()

HostSpawner = Callable[[OnEvent], Awaitable[EngineHost]]
EngineClientFactory = Callable[[str], EngineClient]
# Synchronous (boto3); the agent runs it in a thread. Returns None when there is no manifest.
ManifestReader = Callable[[S3Endpoint, str], object | None]

# Characters of engine output quoted in a failure reason.
REASON_TAIL_CHARS = 1500


class SnapshotOps(Protocol):
    """Snapshot I/O (``snapshotter.ops.StoreSnapshots``); synchronous, run in threads."""

    def runtime(self, python: str) -> dict[str, Any]: ...
    def restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, cancelled: threading.Event) -> RestoreResult: ...
    def capture(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, *, created_by: str, replace: bool) -> CaptureResult: ...


@dataclass(frozen=True)
class _SnapshotJob:
    """What the agent needs after the engine is ready: count its compiles, maybe capture."""

    fp: Fingerprint
    loc: SnapshotLocation
    store: S3Endpoint
    cache_root: Path
    status: RestoreStatus
    # Kernel binaries in the cache root before the launch.
    kernels_before: frozenset[str]


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


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        spawn_host: HostSpawner | None = None,
        engine_client: EngineClientFactory = HttpEngineClient,
        manifest_reader: ManifestReader = read_store_manifest,
        snapshots: SnapshotOps | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = WorkerMetrics()
        self._spawn_host = spawn_host or self._spawn_engine_host_process
        self._engine_client = engine_client
        self._manifest_reader = manifest_reader
        self._snapshots: SnapshotOps = snapshots or StoreSnapshots()
        self._clock = clock
        self.started_at = clock()
        self._facts = Facts()
        self._state = derive_state(self._facts)
        self._state_since = self.started_at
        self.metrics.set_state(self._state)
        self._host: EngineHost | None = None
        self._host_lock = asyncio.Lock()
        self._engine: EngineClient | None = None
        self._engine_url: str | None = None
        self._assignment_task: asyncio.Task[None] | None = None
        # The request behind the engine now running (a wake-up must match it).
        self._launched: AssignRequest | None = None
        # Putting the engine to sleep, or waking it (one at a time: a wake waits for the sleep).
        self._sleep_task: asyncio.Task[None] | None = None
        self._wake_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # cancelled on shutdown
        self._host_tasks: set[asyncio.Task[Any]] = set()  # awaited on shutdown, never cancelled
        self._stopping = False
        # Engine hosts in a row that died before "imported" (restart backoff).
        self._early_exits = 0
        # Called after every state change (the heartbeat tells the controller at once).
        self.on_state_change: Callable[[], None] | None = None
        # The weight caches (opened by start), what they held at the last look, and the
        # bytes per second recent loads read from each source.
        self._caches: dict[str, DiskCache] = {}
        self._cached: list[CachedWeights] = []
        self._load_rates: dict[str, float] = {}

    # -- facts and the derived state ----------------------------------------------

    @property
    def state(self) -> WorkerState:
        return self._state

    @property
    def facts(self) -> Facts:
        return self._facts

    def _update(self, **changes: Any) -> None:
        """The one place facts change; logs and exports a state change."""
        self._facts = replace(self._facts, **changes)
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
            snapshot=_snapshot_view(f.snapshot) if a and f.snapshot else None,
            error=f.failure,
            in_flight=f.in_flight,
            load=f.load if a else None,
            cached=self._cached,
            load_bytes_per_s=dict(self._load_rates),
        )

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Start the first engine host (returns at once; "imported" comes later)."""
        self._replace_host()
        # Downloads and archives left by a previous agent that died mid-way.
        await asyncio.to_thread(shutil.rmtree, self.settings.snapshot_work_dir, True)
        await asyncio.to_thread(self._open_caches)
        await self.scan_caches()
        self._spawn(self._scan_caches_every(self.settings.cache_scan_interval_s), name="scan_caches")

    async def stop(self) -> None:
        """Cancel what is running, then stop the engine host and its whole group."""
        self._stopping = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*list(self._host_tasks), return_exceptions=True)
        async with self._host_lock:
            host, self._host = self._host, None
            if host is not None:
                await host.stop(self._grace_s(self._graceful_stop_fits()))
        await self._close_engine()
        host_cache = self._caches.get("host")
        if host_cache is not None:
            # Memory: nothing else would ever give it back.
            await asyncio.to_thread(shutil.rmtree, host_cache.root, True)
        log.info("agent_stopped")

    # -- weight caches ------------------------------------------------------------

    def _open_caches(self) -> None:
        s = self.settings
        for tier, root, budget in (("host", s.host_cache_dir, s.host_cache_max_bytes),
                                   ("disk", s.disk_cache_dir, s.disk_cache_max_bytes)):
            if root is None or budget <= 0:
                continue
            try:
                if tier == "host":
                    _sweep_orphaned_host_caches(root.parent)
                self._caches[tier] = DiskCache(root, budget)
                if tier == "host":
                    (root / HOST_CACHE_OWNER).write_text(str(os.getpid()))
            except OSError as exc:  # serving goes on from the store
                log.error("cache_unavailable", tier=tier, dir=str(root), error=str(exc))

    def _read_caches(self) -> list[CachedWeights]:
        out: list[CachedWeights] = []
        for tier, cache in self._caches.items():
            try:
                models = cache.models()
            except OSError as exc:
                log.warning("cache_scan_failed", tier=tier, dir=str(cache.root), error=str(exc))
                continue
            out.extend(CachedWeights(uri=m.uri, tier=tier, bytes=m.bytes,  # type: ignore[arg-type]
                                     total_bytes=m.total_bytes) for m in models)
        return sorted(out, key=lambda c: (c.uri, c.tier))

    async def scan_caches(self) -> list[CachedWeights]:
        """Look at what the caches hold now (the status lists it)."""
        if self._caches:
            self._cached = await asyncio.to_thread(self._read_caches)
            for tier in self._caches:
                self.metrics.cache_bytes.labels(tier).set(sum(c.bytes for c in self._cached if c.tier == tier))
        return self._cached

    async def _scan_caches_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.scan_caches()

    def _launch_engine_args(self, req: AssignRequest) -> EngineArgs:
        """The assignment's engine settings, plus this worker's caches for Thaw's loader,
        which checks every file against the manifest's sha256 with or without caches (a
        corrupt object in the store is never served)."""
        s, e = self.settings, req.engine
        if e.load_format != "thaw":
            return e
        extra = dict(e.extra.get("model_loader_extra_config") or {})
        gib = float(1 << 30)
        for tier, dir_key, budget_key in (("host", "host_cache_dir", "host_cache_max_gib"),
                                          ("disk", "cache_dir", "cache_max_gib")):
            cache = self._caches.get(tier)
            if cache is not None:
                extra[dir_key] = str(cache.root)
                extra[budget_key] = cache.max_bytes / gib
        extra.setdefault("verify_sha256", s.cache_verify_sha256)
        return e.model_copy(update={"extra": {**e.extra, "model_loader_extra_config": extra}})

    def _note_load(self, lv: LoadView) -> None:
        """Keep the rate of a load that read from one source (a moving average)."""
        if lv.seconds and lv.bytes and len(lv.sources) == 1:
            [src] = lv.sources
            rate = lv.bytes / lv.seconds
            prev = self._load_rates.get(src)
            self._load_rates[src] = round(rate if prev is None else 0.5 * prev + 0.5 * rate, 1)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._host_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent_task_failed", task=task.get_name(), exc_info=task.exception())

    # -- engine hosts -------------------------------------------------------------

    async def _spawn_engine_host_process(self, on_event: OnEvent) -> EngineHost:
        return await EngineHostProcess.spawn(on_event, log_level=self.settings.log_level,
                                             python=self.settings.python)

    def _grace_s(self, graceful: bool) -> float:
        return self.settings.host_stop_grace_s if graceful else 0.0

    def _graceful_stop_fits(self) -> bool:
        """Whether stopping the engine host now deserves a graceful SIGTERM: it is
        standing by or serving (not loading, not failed)."""
        f = self._facts
        return f.failure is None and (f.launched_at is None or f.engine_ready_at is not None)

    def _replace_host(self, graceful: bool = True) -> asyncio.Task[None]:
        """Stop the current engine host (if any: SIGTERM and a grace period when
        ``graceful``, else SIGKILL) and start a fresh one.

        Runs as its own task that shutdown waits for instead of cancelling, so a
        process being spawned is always known to the agent when it stops.
        """
        if self._host is not None and self._facts.host_imported:
            # Not standing by from now on: the host that imported is on its way out (a
            # release right after a failure must not see "standby" before the new one).
            self._update(host_imported=False)
        task = asyncio.create_task(self._do_replace_host(graceful), name="replace_host")
        self._host_tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def _do_replace_host(self, graceful: bool) -> None:
        async with self._host_lock:
            old, self._host = self._host, None
            if old is not None:
                # From here on its events and its exit are not ours to act on.
                self._update(host_running=False, host_imported=False)
                await old.stop(self._grace_s(graceful))
            if self._stopping:
                return
            try:
                host = await self._spawn_host(self._on_host_event)
            except Exception as exc:  # e.g. the interpreter is gone
                log.exception("engine_host_spawn_failed")
                self._early_exits += 1
                self._note_host_failure(f"cannot start the engine host: {exc}")
                self._schedule_host_restart()
                return
            self._host = host
            self._update(host_running=True, host_imported=False)
            self._spawn(self._watch_host(host), name="watch_host")

    def _schedule_host_restart(self) -> None:
        delay = 0.0
        if self._early_exits:
            delay = min(self.settings.host_restart_backoff_max_s, 2.0 ** (self._early_exits - 1))

        async def restart() -> None:
            await asyncio.sleep(delay)
            await self._replace_host()

        self._spawn(restart(), name="restart_host")

    def _on_host_event(self, host: EngineHost, event: dict[str, Any]) -> None:
        if host is not self._host:
            return  # a host being replaced
        kind = event["event"]
        f = self._facts
        if kind == EV_IMPORTED:
            self._early_exits = 0
            self._update(host_imported=True)
        elif kind == EV_WEIGHTS_LOADED:
            if f.assignment is not None and f.launched_at is not None and f.weights_loaded_at is None:
                report = event.get("load")
                lv = load_view(f.assignment.uri, report if isinstance(report, dict) else None)
                self._note_load(lv)
                log.info("weights_loaded", assignment_id=f.assignment.assignment_id, model=f.assignment.model,
                         tier=lv.tier, seconds=lv.seconds, bytes=lv.bytes, sources=lv.sources)
                for r in (report.get("rejected") if isinstance(report, dict) else None) or []:
                    # A cached copy failed its check: it was evicted and read from elsewhere.
                    log.warning("cache_copy_rejected", assignment_id=f.assignment.assignment_id, **r)
                self._update(weights_loaded_at=float(event.get("t") or self._clock()), load=lv)
                self._spawn(self.scan_caches(), name="scan_caches_after_load")
        elif kind == EV_FAILED:
            self._fail(f"engine failed to start: {event.get('error') or 'no reason given'}")

    async def _watch_host(self, host: EngineHost) -> None:
        code = await host.wait()
        if host is not self._host:
            return  # stopped on purpose
        self._host = None
        f = self._facts
        self._update(host_running=False, host_imported=False)
        self._early_exits = 0 if f.host_imported else self._early_exits + 1
        tail = host.output_tail()[-REASON_TAIL_CHARS:]
        log.error("engine_host_exited", host_pid=host.pid, returncode=code, output_tail=tail)
        if f.release_requested_at is None:
            if f.assignment is None:
                self._note_host_failure(f"engine host exited with status {code} while standing by: {tail}")
            elif f.engine_ready_at is None:
                self._fail(f"engine exited with status {code} while loading: {tail}")
            else:
                self._fail(f"engine exited with status {code} while serving: {tail}")
            self._schedule_host_restart()
        # During a release, the release flow starts the next engine host.

    def _note_host_failure(self, reason: str) -> None:
        # Without an assignment there is nothing to stop; the failure is shown until
        # a release, so whoever manages the pool sees that this worker is unwell.
        if self._facts.failure is None and self._facts.release_requested_at is None:
            self._update(failure=reason)

    # -- assignments ----------------------------------------------------------------

    async def assign(self, req: AssignRequest) -> None:
        """Accept an assignment (raises :class:`Conflict` unless standing by).

        The same ``assignment_id`` again is accepted as a no-op (a retried request).
        Raises :class:`Refused` for a model URI outside ``settings.allowed_uri_prefixes``.
        """
        if self.settings.allowed_uri_prefixes is not None:
            try:
                check_allowed(req.uri, self.settings.allowed_uri_prefixes)
            except S3UriError as exc:
                log.warning("assignment_refused", assignment_id=req.assignment_id, uri=req.uri, error=str(exc))
                raise Refused(f"refusing the assignment: model uri {exc}") from None
        f = self._facts
        if (f.assignment is not None and f.assignment.assignment_id == req.assignment_id
                and f.release_requested_at is None):
            return
        if self._state is WorkerState.ASLEEP:
            self._wake(req)
            return
        if self._state is not WorkerState.STANDBY:
            raise Conflict(f"worker is {self._state.value}, not standby; it takes an assignment only in standby",
                           self._state)
        self._launched = req
        a = Assignment(req.assignment_id, req.model, req.uri, req.served_model_name, self._clock())
        self._update(assignment=a, snapshot_restored_at=None, snapshot=None, launched_at=None,
                     weights_loaded_at=None, engine_ready_at=None, failure=None, in_flight=None, load=None)
        log.info("assignment_accepted", assignment_id=a.assignment_id, model=a.model, uri=a.uri)
        self._assignment_task = self._spawn(self._run_assignment(a, req), name="assignment")

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
            self._fail(f"cannot read the model's manifest at {req.uri}: {exc}")
            return
        if manifest is None:
            self._fail(f"no model at {req.uri} (no thaw-manifest.json: not pushed, or the push was interrupted)")
            return
        cache_root = s.engine_cache_root(a.model)
        job = await self._restore_snapshot(a, req, manifest, store, cache_root)
        host = self._host
        if host is None or not self._facts.host_imported:
            self._fail("the engine host went away before the launch")
            return
        port = free_port()
        cmd = LaunchCommand(
            uri=req.uri, served_model_name=req.served_model_name, max_model_len=req.max_model_len,
            engine=self._launch_engine_args(req), port=port, host=s.host, sleep_mode=req.sleep_mode,
            env=engine_env(req.engine, store.env(), str(s.data_dir), cache_root=str(cache_root),
                           assets_dir=str(s.engine_assets_dir), sleep_mode=req.sleep_mode),
        )
        self._engine_url = f"http://{s.advertised}:{port}"  # for the routes
        self._engine = engine = self._engine_client(f"http://{s.local}:{port}")
        self._update(launched_at=self._clock())
        try:
            await host.launch(cmd)
        except (BrokenPipeError, ConnectionResetError):
            return  # the engine host died: its watcher reports why
        deadline = self._clock() + s.load_timeout_s
        while not await engine.healthy():
            if self._clock() > deadline:
                self._fail(f"engine did not answer /health within {s.load_timeout_s:.0f} s of the launch")
                return
            await asyncio.sleep(s.ready_poll_s)
        now = self._clock()
        self._update(engine_ready_at=now)
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
            self._spawn(self._after_ready(a, job), name="snapshot_after_ready")
        while True:  # in_flight, for /state and the pool manager
            self._update(in_flight=await engine.in_flight())
            await asyncio.sleep(s.in_flight_poll_s)

    # -- snapshots ----------------------------------------------------------------------

    async def _restore_snapshot(
        self, a: Assignment, req: AssignRequest, manifest: object, store: S3Endpoint, cache_root: Path,
    ) -> _SnapshotJob | None:
        """Restore the engine's compile caches for this launch, or record why not.

        Ends the ``snapshot_restored`` phase. Returns what the agent needs once the
        engine is ready, or None when snapshots do not apply to this launch.
        """
        s = self.settings
        reason = None
        if not s.snapshots:
            reason = "snapshots are off on this worker"
        elif not (req.snapshots and req.engine.snapshots):
            reason = "snapshots are off for this model"
        elif req.engine.enforce_eager:
            reason = "eager mode (enforce_eager): vLLM compiles nothing, so there is no cache to snapshot"
        if reason is not None:
            log.info("snapshot_disabled", assignment_id=a.assignment_id, model=a.model, reason=reason)
            self._update(snapshot=SnapshotFacts(RestoreStatus.DISABLED.value, reason=reason),
                         snapshot_restored_at=self._clock())
            return None

        t0 = self._clock()
        fp: Fingerprint | None = None
        try:
            config_sha = _config_sha256(manifest)
            runtime = await asyncio.to_thread(self._snapshots.runtime, s.python)
            fp = fingerprint_of(fingerprint_inputs(
                runtime=runtime, model_uri=req.uri, model_config_sha256=config_sha, engine=req.engine,
                max_model_len=req.max_model_len, engine_assets_dir=str(s.engine_assets_dir),
            ))
        except Exception as exc:  # the snapshot is an optimisation: start without it
            result = RestoreResult(RestoreStatus.SKIPPED_ERROR, f"cannot compute the fingerprint: {exc}")
        else:
            loc = SnapshotLocation.for_model(req.uri, a.model, fp.id)
            self._update(snapshot=SnapshotFacts(RestoreStatus.RESTORING.value, fingerprint=fp.id))
            result = await self._run_restore(store, loc, fp, cache_root)
        seconds = round(self._clock() - t0, 3)
        log_fn = log.warning if result.status.value.startswith("skipped") else log.info
        log_fn("snapshot_restore", assignment_id=a.assignment_id, model=a.model, status=result.status.value,
               fingerprint=fp.id if fp else None, seconds=seconds, bytes=result.bytes, files=result.files,
               reason=result.reason)
        self._update(
            snapshot=SnapshotFacts(result.status.value, fingerprint=fp.id if fp else None, seconds=seconds,
                                   bytes=result.bytes, reason=result.reason),
            snapshot_restored_at=self._clock(),
        )
        if fp is None:
            return None
        before = await asyncio.to_thread(kernel_files, cache_root)
        return _SnapshotJob(fp, loc, store, cache_root, result.status, frozenset(before))

    async def _run_restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint,
                           cache_root: Path) -> RestoreResult:
        s = self.settings
        # The thread outlives a timeout or a cancellation; this tells it to leave the
        # cache root alone and clean up after itself.
        cancelled = threading.Event()
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._snapshots.restore, store, loc, fp, cache_root, s.snapshot_work_dir,
                                  cancelled),
                s.snapshot_restore_timeout_s,
            )
        except TimeoutError:
            cancelled.set()
            return RestoreResult(RestoreStatus.SKIPPED_ERROR,
                                 f"the restore took longer than {s.snapshot_restore_timeout_s:g} s")
        except asyncio.CancelledError:
            cancelled.set()
            raise
        except Exception as exc:  # the store: unreachable, access denied, ...
            return RestoreResult(RestoreStatus.SKIPPED_ERROR,
                                 f"cannot read the snapshot at {loc.uri}: {type(exc).__name__}: {exc}")

    def _set_snapshot(self, a: Assignment, **changes: Any) -> None:
        """Amend the snapshot facts, if ``a`` is still the current assignment."""
        f = self._facts
        if f.assignment is a and f.snapshot is not None:
            self._update(snapshot=replace(f.snapshot, **changes))

    async def _after_ready(self, a: Assignment, job: _SnapshotJob) -> None:
        """Count what the engine compiled during its start; capture a snapshot when
        the start found no usable one."""
        s = self.settings
        after = await asyncio.to_thread(kernel_files, job.cache_root)
        compiled = len(after - job.kernels_before)
        self._set_snapshot(a, compiled_kernels=compiled)
        log.info("snapshot_compile_check", assignment_id=a.assignment_id, model=a.model,
                 fingerprint=job.fp.id, status=job.status.value, compiled_kernels=compiled)
        # Restored, yet the engine compiled: vLLM keyed its cache on something the
        # fingerprint does not cover (e.g. a change in how the engine is started).
        # This start's cache holds what it needed: it replaces the snapshot.
        unused = job.status is RestoreStatus.RESTORED and compiled > 0
        if unused:
            log.warning("snapshot_unused", assignment_id=a.assignment_id, model=a.model,
                        fingerprint=job.fp.id, compiled_kernels=compiled)
        if job.status not in CAPTURE_AFTER and not unused:
            return
        self._set_snapshot(a, capture=CaptureStatus.RUNNING.value)
        t0 = self._clock()
        try:
            result = await asyncio.to_thread(
                self._snapshots.capture, job.store, job.loc, job.fp, job.cache_root, s.snapshot_work_dir,
                created_by=s.worker_id, replace=job.status is not RestoreStatus.MISSING,
            )
        except Exception as exc:  # the store; serving is not affected
            result = CaptureResult(CaptureStatus.FAILED, f"{type(exc).__name__}: {exc}")
        log_fn = log.warning if result.status is CaptureStatus.FAILED else log.info
        log_fn("snapshot_capture", assignment_id=a.assignment_id, model=a.model, fingerprint=job.fp.id,
               uri=job.loc.uri, status=result.status.value, bytes=result.bytes,
               seconds=round(self._clock() - t0, 3), reason=result.reason)
        self._set_snapshot(a, capture=result.status.value)

    def _fail(self, reason: str) -> None:
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
        self._update(failure=reason, in_flight=None)
        self._spawn(self._close_engine(), name="close_engine")
        if self._host is not None and self._host.launched:
            self._replace_host(graceful=False)

    async def _close_engine(self) -> None:
        engine, self._engine, self._engine_url = self._engine, None, None
        if engine is not None:
            await engine.aclose()

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
        self._update(sleep_requested_at=self._clock())
        self._sleep_task = self._spawn(self._run_sleep(req), name="sleep")
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
        a = Assignment(req.assignment_id, req.model, req.uri, req.served_model_name, self._clock())
        self._update(assignment=a, sleep_requested_at=None, snapshot_restored_at=None, snapshot=None,
                     launched_at=None, weights_loaded_at=None, engine_ready_at=None, woken_at=None,
                     failure=None, load=LoadView(tier="asleep"))
        log.info("assignment_accepted", assignment_id=a.assignment_id, model=a.model, uri=a.uri, wake=True)
        self._wake_task = self._spawn(self._run_wake(a), name="wake")

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
        self._update(engine_ready_at=now, woken_at=now)
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
                self._update(failure=None)
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
            self._clear_assignment()
            return True
        drain = self._state is WorkerState.READY  # else loading: abort
        log.info("release", assignment_id=f.assignment.assignment_id, from_state=self._state.value,
                 drain_timeout_s=req.drain_timeout_s)
        self._update(release_requested_at=self._clock())
        self._spawn(self._run_release(drain, req.drain_timeout_s), name="release")
        return True

    async def _run_release(self, drain: bool, drain_timeout_s: float) -> None:
        for task in (self._assignment_task, self._sleep_task, self._wake_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        engine = self._engine
        if drain and engine is not None:
            await self._drain(engine, drain_timeout_s)
        await self._close_engine()
        if self._host is None or self._host.launched:
            await self._replace_host(graceful=drain)
        # Before standby is reported: the controller places the next model by it.
        await self.scan_caches()
        self._clear_assignment()

    async def _drain(self, engine: EngineClient, timeout_s: float) -> None:
        """Wait until the engine has nothing running or waiting (two readings in a
        row), or ``timeout_s`` passes, or the engine is gone."""
        s = self.settings
        deadline = self._clock() + timeout_s
        zeros = 0
        while True:
            n = await engine.in_flight()
            self._update(in_flight=n)
            zeros = zeros + 1 if n == 0 else 0
            if zeros >= 2:
                log.info("drained")
                return
            if self._host is None or self._host.returncode is not None:
                log.warning("drain_engine_gone")
                return
            if self._clock() >= deadline:
                log.warning("drain_timeout", in_flight=n, timeout_s=timeout_s)
                return
            await asyncio.sleep(s.drain_poll_s)

    def _clear_assignment(self) -> None:
        self._assignment_task = None
        self._sleep_task = self._wake_task = None
        self._launched = None
        self._update(assignment=None, snapshot_restored_at=None, snapshot=None, launched_at=None,
                     weights_loaded_at=None, engine_ready_at=None, release_requested_at=None, failure=None,
                     in_flight=None, sleep_requested_at=None, woken_at=None, load=None)


# In a host cache directory: the pid of the agent it belongs to.
HOST_CACHE_OWNER = ".owner"


def _sweep_orphaned_host_caches(parent: Path) -> None:
    """Remove the host caches of agents that died without giving theirs back (SIGKILL):
    on a tmpfs, nothing else ever would."""
    try:
        dirs = [d for d in parent.iterdir() if d.is_dir()]
    except FileNotFoundError:
        return
    for d in dirs:
        try:
            pid = int((d / HOST_CACHE_OWNER).read_text().strip())
        except (OSError, ValueError):
            continue  # not an agent's (or still being set up)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.info("host_cache_orphan_removed", dir=str(d), pid=pid)
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


def _config_sha256(manifest: object) -> str:
    """sha256 of the model's config.json, from its store manifest (nothing downloaded)."""
    if isinstance(manifest, Manifest):
        for entry in manifest.files:
            if entry.path == "config.json":
                return entry.sha256
    raise ValueError("the model's manifest lists no config.json")


def _snapshot_view(f: SnapshotFacts) -> SnapshotView:
    return SnapshotView(fingerprint=f.fingerprint, status=f.status, seconds=f.seconds, bytes=f.bytes,
                        reason=f.reason, compiled_kernels=f.compiled_kernels, capture=f.capture)
