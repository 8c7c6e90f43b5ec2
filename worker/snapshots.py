"""Engine snapshots around a launch (``snapshotter``), for the agent.

Before a compiled-mode launch the model's compile caches for its fingerprint are
restored from the store into the engine's cache root (``phases.snapshot_restored``
ends then); once the engine is ready, the kernels it compiled anyway are counted
and, when there was no usable snapshot, one is captured in the background. A
snapshot only ever makes a start faster: any problem with one is logged and the
engine builds its caches as usual.

Facts go through the owner's ``record``; a late result for an assignment that is
no longer current is dropped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
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
)
from snapshotter.store import SnapshotLocation
from thaw.log import get_logger
from thaw.objstore import S3Endpoint
from thaw.wire import AssignRequest, SnapshotView
from weight_streaming.manifest import Manifest
from worker.settings import AgentSettings
from worker.state import Assignment, Facts, SnapshotFacts

log = get_logger()


class SnapshotOps(Protocol):
    """Snapshot I/O (``snapshotter.ops.StoreSnapshots``); synchronous, run in threads."""

    def runtime(self, python: str) -> dict[str, Any]: ...
    def restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, cancelled: threading.Event) -> RestoreResult: ...
    def capture(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, *, created_by: str, replace: bool) -> CaptureResult: ...


@dataclass(frozen=True)
class SnapshotJob:
    """What is left to do once the engine is ready: count its compiles, maybe capture."""

    fp: Fingerprint
    loc: SnapshotLocation
    store: S3Endpoint
    cache_root: Path
    status: RestoreStatus
    # Kernel binaries in the cache root before the launch.
    kernels_before: frozenset[str]


class EngineSnapshots:
    def __init__(self, settings: AgentSettings, ops: SnapshotOps, *, facts: Callable[[], Facts],
                 record: Callable[..., None], clock: Callable[[], float]) -> None:
        self._settings = settings
        self._ops = ops
        self._facts = facts
        self._record = record
        self._clock = clock

    async def restore(self, a: Assignment, req: AssignRequest, manifest: object, store: S3Endpoint,
                      cache_root: Path) -> SnapshotJob | None:
        """Restore the engine's compile caches for this launch, or record why not.

        Ends the ``snapshot_restored`` phase. Returns what is left to do once the
        engine is ready, or None when snapshots do not apply to this launch.
        """
        s = self._settings
        reason = None
        if not s.snapshots:
            reason = "snapshots are off on this worker"
        elif not (req.snapshots and req.engine.snapshots):
            reason = "snapshots are off for this model"
        elif req.engine.enforce_eager:
            reason = "eager mode (enforce_eager): vLLM compiles nothing, so there is no cache to snapshot"
        if reason is not None:
            log.info("snapshot_disabled", assignment_id=a.assignment_id, model=a.model, reason=reason)
            self._record(snapshot=SnapshotFacts(RestoreStatus.DISABLED.value, reason=reason),
                         snapshot_restored_at=self._clock())
            return None

        t0 = self._clock()
        fp: Fingerprint | None = None
        try:
            config_sha = config_sha256(manifest)
            runtime = await asyncio.to_thread(self._ops.runtime, s.python)
            fp = fingerprint_of(fingerprint_inputs(
                runtime=runtime, model_uri=req.uri, model_config_sha256=config_sha, engine=req.engine,
                max_model_len=req.max_model_len, engine_assets_dir=str(s.engine_assets_dir),
            ))
        except Exception as exc:  # the snapshot is an optimisation: start without it
            result = RestoreResult(RestoreStatus.SKIPPED_ERROR, f"cannot compute the fingerprint: {exc}")
        else:
            loc = SnapshotLocation.for_model(req.uri, a.model, fp.id)
            self._record(snapshot=SnapshotFacts(RestoreStatus.RESTORING.value, fingerprint=fp.id))
            result = await self._run_restore(store, loc, fp, cache_root)
        seconds = round(self._clock() - t0, 3)
        log_fn = log.warning if result.status.value.startswith("skipped") else log.info
        log_fn("snapshot_restore", assignment_id=a.assignment_id, model=a.model, status=result.status.value,
               fingerprint=fp.id if fp else None, seconds=seconds, bytes=result.bytes, files=result.files,
               reason=result.reason)
        self._record(
            snapshot=SnapshotFacts(result.status.value, fingerprint=fp.id if fp else None, seconds=seconds,
                                   bytes=result.bytes, reason=result.reason),
            snapshot_restored_at=self._clock(),
        )
        if fp is None:
            return None
        before = await asyncio.to_thread(kernel_files, cache_root)
        return SnapshotJob(fp, loc, store, cache_root, result.status, frozenset(before))

    async def _run_restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint,
                           cache_root: Path) -> RestoreResult:
        s = self._settings
        # The thread outlives a timeout or a cancellation; this tells it to leave the
        # cache root alone and clean up after itself.
        cancelled = threading.Event()
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self._ops.restore, store, loc, fp, cache_root, s.snapshot_work_dir, cancelled),
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

    def _amend(self, a: Assignment, **changes: Any) -> None:
        """Amend the snapshot facts, if ``a`` is still the current assignment."""
        f = self._facts()
        if f.assignment is a and f.snapshot is not None:
            self._record(snapshot=replace(f.snapshot, **changes))

    async def after_ready(self, a: Assignment, job: SnapshotJob) -> None:
        """Count what the engine compiled during its start; capture a snapshot when
        the start found no usable one."""
        s = self._settings
        after = await asyncio.to_thread(kernel_files, job.cache_root)
        compiled = len(after - job.kernels_before)
        self._amend(a, compiled_kernels=compiled)
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
        self._amend(a, capture=CaptureStatus.RUNNING.value)
        t0 = self._clock()
        try:
            result = await asyncio.to_thread(
                self._ops.capture, job.store, job.loc, job.fp, job.cache_root, s.snapshot_work_dir,
                created_by=s.worker_id, replace=job.status is not RestoreStatus.MISSING,
            )
        except Exception as exc:  # the store; serving is not affected
            result = CaptureResult(CaptureStatus.FAILED, f"{type(exc).__name__}: {exc}")
        log_fn = log.warning if result.status is CaptureStatus.FAILED else log.info
        log_fn("snapshot_capture", assignment_id=a.assignment_id, model=a.model, fingerprint=job.fp.id,
               uri=job.loc.uri, status=result.status.value, bytes=result.bytes,
               seconds=round(self._clock() - t0, 3), reason=result.reason)
        self._amend(a, capture=result.status.value)


def config_sha256(manifest: object) -> str:
    """sha256 of the model's config.json, from its store manifest (nothing downloaded)."""
    if isinstance(manifest, Manifest):
        for entry in manifest.files:
            if entry.path == "config.json":
                return entry.sha256
    raise ValueError("the model's manifest lists no config.json")


def snapshot_view(f: SnapshotFacts) -> SnapshotView:
    return SnapshotView(fingerprint=f.fingerprint, status=f.status, seconds=f.seconds, bytes=f.bytes,
                        reason=f.reason, compiled_kernels=f.compiled_kernels, capture=f.capture)
