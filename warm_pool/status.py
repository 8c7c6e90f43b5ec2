"""The operators' view of the pool (``GET /v1/state``, ``thaw pool status``): each
shape's instances, spend, budget and launch backoff; each model's replicas, traffic
and last cold start; each worker's state and details."""

from __future__ import annotations

from collections.abc import Mapping

from thaw.config import ThawConfig
from thaw.wire import (
    BatchQueue,
    ColdStartRecord,
    ModelRoute,
    ModelRow,
    PoolStatus,
    ShapeRow,
    WorkerDetail,
    WorkerRow,
    WorkerState,
)
from warm_pool.fleet.facts import FleetFacts
from warm_pool.fleet.machines import ShapeBackoff
from warm_pool.fleet.view import count_states
from warm_pool.policy.batch import standby_use
from warm_pool.policy.decide import ModelActivity, PolicyState, WorkerView
from warm_pool.providers.provider import Provider


def batch_share(seconds: tuple[float, float] | None) -> float | None:
    """The share of standby time lent to batch (None: no standby time yet)."""
    if seconds is None or sum(seconds) <= 0:
        return None
    return round(seconds[1] / sum(seconds), 4)


def pool_status(*, now: float, cfg: ThawConfig, fleet: FleetFacts, views: dict[str, WorkerView],
                routes: dict[str, ModelRoute], activity: dict[str, ModelActivity],
                cold_starts: Mapping[str, ColdStartRecord], shape_backoff: Mapping[str, ShapeBackoff],
                providers: Mapping[str, Provider], state: PolicyState, epoch: str, adopted: bool,
                standby_seconds: Mapping[str, tuple[float, float]] | None = None,
                classes: Mapping[str, str] | None = None,
                batch_census: tuple[Mapping[str, int], Mapping[tuple[str, str], int]] | None = None) -> PoolStatus:
    """The pool's status at ``now``; ``standby_seconds``: per shape, standby
    instance-seconds idle and lent to batch; ``classes``: each model's engine class;
    ``batch_census``: batches by status and running batches' lines by (model, state)."""
    use = standby_use(views.values(), activity)
    shapes = []
    for p in cfg.pools:
        shape = cfg.shape(p.shape)
        # Instances: a packed engine is part of its worker's (counted and billed once).
        mine = [v for v in views.values() if v.shape == p.shape and v.host is None]
        billed = [v for v in mine if v.state not in (WorkerState.STOPPED, WorkerState.UNREACHABLE)]
        b = shape_backoff.get(p.shape)
        provider = providers.get(p.shape)
        pstatus = getattr(provider, "status", None)
        ps = state.pools.get(p.shape)
        shapes.append(ShapeRow(
            shape=p.shape, provider=p.provider, counts=count_states(v.state for v in mine),
            standby_min=p.standby_min, standby_max=p.standby_max, max_instances=p.max_instances,
            budget_usd_per_hour=p.budget_usd_per_hour,
            spend_usd_per_hour=round(len(billed) * (shape.price_per_hour_usd if shape else 0.0), 4),
            backoff_until=b.until if b and b.until > now else None,
            backoff_reason=b.reason if b and b.until > now else None,
            provider_status=(pstatus().get(p.shape, {}) if callable(pstatus) else {}),
            standby_target=ps.target.target if ps and ps.target else None,
            standby_granted=ps.grant.standby if ps and ps.grant else None,
            budget_shortfall=ps.grant.shortfall if ps and ps.grant else 0,
            standby_lent_to_batch=use.get(p.shape, (0, 0))[1],
            standby_batch_share=batch_share((standby_seconds or {}).get(p.shape)),
        ))
    models = []
    # Each model's workers, found once (not by a scan of the fleet per model).
    by_model: dict[str, list[WorkerView]] = {}
    for v in views.values():
        if v.model is not None:
            by_model.setdefault(v.model, []).append(v)
    for m in cfg.models:
        a = activity.get(m.name, ModelActivity())
        r = routes[m.name]
        models.append(ModelRow(
            name=m.name, served_name=m.resolved_served_name,
            replicas=count_states(st for v in by_model.get(m.base, ()) if (st := v.adapter(m.name)))
            if m.base is not None else count_states(v.state for v in by_model.get(m.name, ())),
            queued=a.queued, in_flight=a.in_flight, last_request_at=a.last_request_at,
            error=r.error, backoff_until=r.backoff_until, last_cold_start=cold_starts.get(m.name),
            engine_class=(classes or {}).get(m.name),
        ))
    workers, details = [], []
    for wid in sorted(views):
        v, f = views[wid], fleet.facts[wid]
        born = f.instance.launched_at if f.instance else (f.launch_requested_at or
                                                          (f.status.started_at if f.status else now))
        workers.append(WorkerRow(id=wid, instance_id=f.instance.instance_id if f.instance else
                                 (f.status.instance_id if f.status else None),
                                 control_url=fleet.control_url(wid), state=v.state, model=v.model,
                                 age_s=round(max(now - born, 0.0), 1)))
        details.append(WorkerDetail(
            id=wid, shape=v.shape, assignment_id=v.assignment_id,
            engine_url=f.status.engine_url if f.status else None, error=v.error,
            last_heartbeat_s_ago=round(now - f.heard_at, 1) if f.heard_at else None,
            provider_state=f.instance.state.value if f.instance else None,
            load=f.status.load if f.status else None, cached=list(v.cached),
            prebuilt=f.status.prebuilt if f.status else None,
            host_worker_id=v.host, memory_bytes=v.memory_bytes or None, capacity_bytes=v.capacity_bytes or None,
            adapters=list(f.status.adapters) if f.status else [], batch=v.batch,
        ))
    batches, lines = batch_census or ({}, {})
    by_state: dict[str, int] = {}
    for (_, st), n in lines.items():
        by_state[st] = by_state.get(st, 0) + n
    return PoolStatus(now=now, controller_epoch=epoch, adopted=adopted, shapes=shapes,
                      models=models, workers=workers, worker_details=details,
                      batch=BatchQueue(batches=dict(batches), lines=by_state))
