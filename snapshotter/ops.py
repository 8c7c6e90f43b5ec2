"""The two things a worker does with snapshots around an engine start.

:func:`restore_snapshot` runs before the launch: look the fingerprint up, check the
manifest's inputs against ours, download and verify the archive, unpack it into a
staging directory and move it into the engine's cache root. Anything wrong with the
snapshot is a status (``skipped_mismatch``, ``skipped_corrupt``), never an exception:
a snapshot may make a start faster, never make it fail. Store errors (unreachable,
access denied) do raise; the caller turns them into ``skipped_error``.

:func:`capture_snapshot` runs after the engine is ready: pack the cache root and
upload it with its manifest, unless a snapshot for the fingerprint appeared meanwhile.

Both are synchronous (boto3, tar): the agent runs them in threads.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from snapshotter.archive import (
    ArchiveError,
    cache_files,
    create_archive,
    extract_archive,
    has_warm_state,
)
from snapshotter.fingerprint import Fingerprint, diff_inputs, format_diff, probe_runtime
from snapshotter.store import (
    SnapshotLocation,
    SnapshotStoreError,
    download_archive,
    read_snapshot_manifest,
    upload_snapshot,
)
from thaw.objstore import S3Endpoint
from thaw.s3client import S3Client


class RestoreStatus(StrEnum):
    RESTORING = "restoring"  # in progress
    RESTORED = "restored"  # unpacked into the cache root
    LOCAL = "local"  # the cache root already holds warm state (this worker ran the model before)
    MISSING = "missing"  # no snapshot for this fingerprint yet
    SKIPPED_MISMATCH = "skipped_mismatch"  # its manifest's inputs differ from ours
    SKIPPED_CORRUPT = "skipped_corrupt"  # bad manifest, archive missing, sha256 or tar wrong, unsafe member
    SKIPPED_ERROR = "skipped_error"  # the store could not be asked, or the restore timed out
    DISABLED = "disabled"  # off for this worker or assignment, or eager mode


# After these, the engine builds its caches from nothing and the worker captures them.
CAPTURE_AFTER = frozenset({RestoreStatus.MISSING, RestoreStatus.SKIPPED_MISMATCH,
                           RestoreStatus.SKIPPED_CORRUPT})


@dataclass(frozen=True)
class RestoreResult:
    status: RestoreStatus
    reason: str | None = None
    # Archive bytes downloaded and files unpacked (restored only).
    bytes: int | None = None
    files: int | None = None


class CaptureStatus(StrEnum):
    RUNNING = "running"
    UPLOADED = "uploaded"
    EXISTS = "exists"  # another worker captured this fingerprint first
    EMPTY = "empty"  # the engine left no compile cache (e.g. the cache is disabled)
    FAILED = "failed"


@dataclass(frozen=True)
class CaptureResult:
    status: CaptureStatus
    reason: str | None = None
    bytes: int | None = None


def restore_snapshot(
    client: S3Client, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path, work_dir: Path,
    *, cancelled: threading.Event | None = None,
) -> RestoreResult:
    """Restore the snapshot at ``loc`` into ``cache_root`` (see the module docstring).

    ``work_dir`` holds the download and the staging directory (removed afterwards);
    it should be on the same file system as ``cache_root`` so that the final move is
    a rename. When ``cancelled`` is set the restore stops without touching ``cache_root``.
    """
    try:
        manifest = read_snapshot_manifest(client, loc)
    except SnapshotStoreError as exc:
        return RestoreResult(RestoreStatus.SKIPPED_CORRUPT, str(exc))
    if manifest is None:
        return RestoreResult(RestoreStatus.MISSING, f"no snapshot at {loc.uri}")
    diff = diff_inputs(fp.inputs, manifest.inputs)
    if manifest.fingerprint != fp.id:
        diff = {"fingerprint": (fp.id, manifest.fingerprint), **diff}
    if diff:
        return RestoreResult(RestoreStatus.SKIPPED_MISMATCH,
                             f"{loc.uri}/manifest.json differs (ours != stored): {format_diff(diff)}")
    if has_warm_state(cache_root):
        return RestoreResult(RestoreStatus.LOCAL, f"{cache_root} already holds compile caches")
    work = work_dir / f"restore-{uuid.uuid4().hex[:12]}"
    work.mkdir(parents=True)
    try:
        archive = work / "archive.tar.gz"  # not the manifest's name: that is not trusted
        staged = work / "root"
        try:
            download_archive(client, loc, manifest, archive)
            if cancelled is not None and cancelled.is_set():
                return RestoreResult(RestoreStatus.SKIPPED_ERROR, "cancelled")
            files = extract_archive(archive, staged, max_bytes=manifest.unpacked_bytes, cancelled=cancelled)
        except ArchiveError as exc:
            return RestoreResult(RestoreStatus.SKIPPED_CORRUPT, str(exc))
        if cancelled is not None and cancelled.is_set():
            return RestoreResult(RestoreStatus.SKIPPED_ERROR, "cancelled")
        install(staged, cache_root)
        return RestoreResult(RestoreStatus.RESTORED, None, bytes=manifest.archive.size, files=files)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install(staged: Path, cache_root: Path) -> None:
    """Move each top-level entry of ``staged`` into ``cache_root``.

    Each move is one rename, so the engine sees a cache directory whole or not at
    all. An entry that already exists locally with files in it is kept (it is this
    machine's own); one without (left by a start that failed early) is replaced.
    """
    cache_root.mkdir(parents=True, exist_ok=True)
    kept = {p.relative_to(cache_root).parts[0] for p in cache_files(cache_root)}
    for entry in sorted(staged.iterdir()):
        if entry.name in kept:
            continue
        target = cache_root / entry.name
        if target.exists():
            shutil.rmtree(target)
        os.rename(entry, target)


def capture_snapshot(
    client: S3Client, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path, work_dir: Path,
    *, created_by: str, replace: bool,
) -> CaptureResult:
    """Upload the warm state of ``cache_root`` as the snapshot at ``loc``.

    Unless ``replace`` (the one there was unusable), an existing snapshot wins and
    nothing is uploaded. Store errors raise.
    """
    if not replace:
        try:
            if read_snapshot_manifest(client, loc) is not None:
                return CaptureResult(CaptureStatus.EXISTS)
        except SnapshotStoreError:
            pass  # an unreadable manifest: ours replaces it
    work = work_dir / f"capture-{uuid.uuid4().hex[:12]}"
    work.mkdir(parents=True)
    try:
        try:
            info = create_archive(cache_root, work / "snapshot.tar.gz")
        except ArchiveError as exc:
            return CaptureResult(CaptureStatus.EMPTY, str(exc))
        upload_snapshot(client, loc, info, fp.inputs, created_by=created_by)
        return CaptureResult(CaptureStatus.UPLOADED, bytes=info.size)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A store that does not answer in this long will not make a start faster.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60


class StoreSnapshots:
    """Snapshot I/O against an assignment's store (what the agent uses by default)."""

    def runtime(self, python: str) -> dict[str, Any]:
        return probe_runtime(python)

    def restore(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, cancelled: threading.Event) -> RestoreResult:
        client = store.client(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S)
        return restore_snapshot(client, loc, fp, cache_root, work_dir, cancelled=cancelled)

    def capture(self, store: S3Endpoint, loc: SnapshotLocation, fp: Fingerprint, cache_root: Path,
                work_dir: Path, *, created_by: str, replace: bool) -> CaptureResult:
        return capture_snapshot(store.client(), loc, fp, cache_root, work_dir,
                                created_by=created_by, replace=replace)
