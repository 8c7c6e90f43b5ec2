"""The worker's state, derived by one pure function from independent facts.

Nothing sets the state directly. The agent records facts as they happen (the
engine host reported "imported", an assignment arrived, the engine answered
``/health``, a release was asked for, something failed) and :func:`derive_state`
computes the state from them, so two code paths can never disagree about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from thaw.wire import LoadView, WorkerState

__all__ = ["AdapterFacts", "Assignment", "Facts", "Prebuilt", "SnapshotFacts", "WorkerState", "derive_state", "load_view"]


@dataclass(frozen=True)
class Assignment:
    """The model this worker was told to serve (``thaw.wire.AssignRequest`` carries no secret)."""

    assignment_id: str
    model: str
    uri: str
    served_model_name: str
    assigned_at: float
    # The memory its engine holds (thaw.fit.engine_memory; None: not counted).
    memory_bytes: int | None = None
    # The model's registry revision (AssignRequest.revision), reported back.
    revision: int | None = None
    # Batch work on a standby (AssignRequest.batch): any other assignment preempts it.
    batch: bool = False


@dataclass(frozen=True)
class SnapshotFacts:
    """What happened to the engine snapshot of the current assignment (``snapshotter``)."""

    # snapshotter.ops.RestoreStatus values: restoring, restored, local, missing,
    # skipped_mismatch, skipped_corrupt, skipped_error, disabled.
    status: str
    fingerprint: str | None = None
    # How long the restore took (lookup, download, unpack) and the archive bytes it fetched.
    seconds: float | None = None
    bytes: int | None = None
    # Why it was skipped, disabled or missing.
    reason: str | None = None
    # Compiled kernel binaries the engine wrote during this start (0: every kernel came
    # from the cache); None until the engine is ready, or in eager mode.
    compiled_kernels: int | None = None
    # snapshotter.ops.CaptureStatus values, once a capture started after the start.
    capture: str | None = None


@dataclass(frozen=True)
class Prebuilt:
    """An engine kept across assignments (built ahead, or parked after a release): what
    it can take by a swap, and the model whose weights it holds."""

    engine_class: str
    # Digest of the vocabulary files it was built with (worker.identity): a swap needs
    # the same, as the engine core keeps its tokenizer for structured output.
    vocab: str
    model: str
    uri: str
    port: int
    # None while it is being built.
    built_at: float | None = None
    # Each step of its last park, in seconds, as the engine host timed them (None: never
    # parked; it was built ahead and has served nothing since).
    park_steps_s: Mapping[str, float] | None = None


@dataclass(frozen=True)
class AdapterFacts:
    """A LoRA adapter in the engine of the current assignment (``worker.adapters``)."""

    model: str
    uri: str
    served_model_name: str
    # loading | ready | unloading | failed (thaw.wire.AdapterView)
    state: str
    since: float
    requested_at: float
    error: str | None = None


@dataclass(frozen=True)
class Facts:
    """Independent observations; each is set in one place by the agent."""

    # An engine host process exists (spawned, not yet seen to exit).
    host_running: bool = False
    # That engine host reported "imported": it can take a launch now.
    host_imported: bool = False
    assignment: Assignment | None = None
    # When the snapshot restore finished or was skipped (None: not yet).
    snapshot_restored_at: float | None = None
    snapshot: SnapshotFacts | None = None
    # When the launch command went to the engine host (None: not sent yet).
    launched_at: float | None = None
    weights_loaded_at: float | None = None
    # When the engine first answered GET /health with 200.
    engine_ready_at: float | None = None
    # When a release of the current assignment was accepted (drain in progress).
    release_requested_at: float | None = None
    # Why the last assignment failed (cleared by a release), and its kind
    # (thaw.wire.FailureKind: from the type of the exception behind it).
    failure: str | None = None
    failure_kind: str | None = None
    # Requests running + waiting in the engine, from its /metrics (None: unknown).
    in_flight: int | None = None
    # When putting the engine to sleep was asked for (it drains first, then sleeps);
    # cleared by the wake-up of the next assignment of the model, or by a release.
    sleep_requested_at: float | None = None
    # When this assignment woke a sleeping engine instead of loading the model.
    woken_at: float | None = None
    # How the weights were loaded (from the engine's "weights_loaded" event).
    load: LoadView | None = None
    # The engine this worker keeps across assignments (tied to the engine host: gone
    # with it).
    prebuilt: Prebuilt | None = None
    # LoRA adapters in the current assignment's engine (gone with the assignment).
    adapters: tuple[AdapterFacts, ...] = ()


def derive_state(f: Facts) -> WorkerState:
    """The worker state for these facts.

    Precedence: a release in progress is ``draining`` even if the engine died while
    draining (the release finishes either way); a failure is ``failed`` until a
    release clears it; a sleep asked for is ``asleep`` at once (no new requests are
    routed to it; it drains, then sleeps); an assignment is ``loading`` until the
    engine answers, then ``ready``; without one, the worker is ``standby`` once an
    engine host has paid its imports, else ``starting``.
    """
    if f.release_requested_at is not None:
        return WorkerState.DRAINING
    if f.failure is not None:
        return WorkerState.FAILED
    if f.assignment is not None and f.sleep_requested_at is not None:
        return WorkerState.ASLEEP
    if f.assignment is not None:
        return WorkerState.READY if f.engine_ready_at is not None else WorkerState.LOADING
    if f.host_running and f.host_imported:
        return WorkerState.STANDBY
    return WorkerState.STARTING


# Sources a load can read from, fastest first.
_SOURCE_ORDER = ("host", "disk", "local", "s3")


def load_view(uri: str, report: Mapping[str, object] | None,
              swap_steps: Mapping[str, object] | None = None) -> LoadView:
    """The load of ``uri`` as the engine's loader reported it (``report``: bytes,
    seconds, bytes per source; None from a loader that reports nothing). Its tier is
    the slowest source any byte came from: one file from the store makes it an s3
    load whatever the caches held. ``swap_steps``: a swap's steps in seconds (the
    engine host's ``swapped`` event); given, the load was a swap."""
    sources: dict[str, int] = {}
    seconds = nbytes = verified = None
    if report is not None:
        raw = report.get("sources")
        if isinstance(raw, Mapping):
            sources = {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and v > 0}
        s, b = report.get("seconds"), report.get("bytes")
        seconds = float(s) if isinstance(s, int | float) else None
        nbytes = int(b) if isinstance(b, int) else None
        v = report.get("tensors_verified")
        verified = int(v) if isinstance(v, int) else None
    used = [t for t in _SOURCE_ORDER if sources.get(t)]
    tier = used[-1] if used else ("s3" if uri.startswith("s3://") else "local")
    steps = {str(k): float(v) for k, v in (swap_steps or {}).items() if isinstance(v, int | float)}
    return LoadView(tier=tier, seconds=seconds, bytes=nbytes, sources=sources,  # type: ignore[arg-type]
                    tensors_verified=verified, swap=swap_steps is not None, steps_s=steps)
