"""A worker's status (its ``/state``, the answer to every control call, each heartbeat):
one pure function of its facts, the state derived from them and what its parts hold."""

from __future__ import annotations

from thaw.wire import AdapterView, CachedWeights, Phases, PrebuiltView, WorkerStatus
from worker.launch import reported_kind
from worker.settings import AgentSettings
from worker.snapshots import snapshot_view
from worker.state import Facts, Prebuilt, WorkerState


def worker_status(settings: AgentSettings, f: Facts, state: WorkerState, *, started_at: float, state_since: float,
                  engine_url: str | None, cached: list[CachedWeights], load_bytes_per_s: dict[str, float],
                  engines: list[str], adapters: list[AdapterView], seq: int = 0) -> WorkerStatus:
    """The status; what belongs to an assignment is left out without one, and the
    engine's URL is shown only while it is ready (the routes send requests to it)."""
    s = settings
    a = f.assignment
    return WorkerStatus(
        worker_id=s.worker_id,
        instance_id=s.instance_id or s.worker_id,
        shape=s.shape,
        control_url=s.control_url,
        state=state,
        model=a.model if a else None,
        assignment_id=a.assignment_id if a else None,
        revision=a.revision if a else None,
        batch=a.batch if a else False,
        served_model_name=a.served_model_name if a else None,
        engine_url=engine_url if state is WorkerState.READY else None,
        started_at=started_at,
        state_since=state_since,
        seq=seq,
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
        failure_kind=reported_kind(f.failure_kind) if f.failure is not None else None,
        in_flight=f.in_flight,
        load=f.load if a else None,
        cached=cached,
        load_bytes_per_s=load_bytes_per_s,
        prebuilt=prebuilt_view(f.prebuilt),
        memory_bytes=a.memory_bytes if a else None,
        capacity_bytes=s.capacity_bytes or None,
        host_worker_id=s.host_worker_id,
        engines=engines,
        adapters=adapters,
    )


def prebuilt_view(p: Prebuilt | None) -> PrebuiltView | None:
    if p is None:
        return None
    return PrebuiltView(engine_class=p.engine_class, model=p.model, state="ready" if p.built_at else "building",
                        built_at=p.built_at, park_steps_s=dict(p.park_steps_s) if p.park_steps_s else None)
