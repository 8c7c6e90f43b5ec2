"""The activators' calls: their traffic (``warm_pool.traffic``: reports, demand at zero,
cold starts) and the route table they long-poll (``warm_pool.routes``)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from thaw.wire import ActivityReport, ColdStartRecord, DemandReply, DemandSignal, RouteTable
from warm_pool.api.errors import NotFound, refusal_doc
from warm_pool.api.parts import Manager
from warm_pool.policy.decide import ModelActivity

router = APIRouter()


@router.post("/v1/reports", status_code=204)
async def report(body: ActivityReport, manager: Manager) -> Response:
    manager.traffic.report(
        body.activator_id,
        {name: ModelActivity(r.queued, r.in_flight, r.last_request_at) for name, r in body.models.items()},
        arrivals={name: r.arrivals for name, r in body.models.items()},
        ttfts={name: r.ttft_s for name, r in body.models.items() if r.ttft_s},
    )
    return Response(status_code=204)


@router.post("/v1/demand", status_code=202, response_model=DemandReply,
             responses={404: refusal_doc("None of the models is in the config")})
async def demand(body: DemandSignal, manager: Manager) -> JSONResponse:
    known: dict[str, None] = {}  # by name (a model may be named by its served name too)
    unknown: list[str] = []
    for name in dict.fromkeys(body.models):
        model = manager.cfg.model(name)
        if model is None:
            unknown.append(name)
        else:
            known[model.name] = None
            manager.parts.start_traces.demanded(model.name, body.traces.get(name))
    if not known:
        raise NotFound(f"unknown model{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
    for name in known:
        manager.traffic.demand(name)
    return JSONResponse(DemandReply(accepted=len(known), unknown=unknown).model_dump(), status_code=202)


@router.post("/v1/cold_starts", status_code=204)
async def cold_start(body: ColdStartRecord, manager: Manager) -> Response:
    manager.traffic.record_cold_start(body)
    return Response(status_code=204)


@router.get("/v1/routes", response_model=RouteTable,
            responses={503: refusal_doc("The controller is still adopting the fleet (see Retry-After)")})
async def routes(manager: Manager, since: int = Query(-1), epoch: str | None = Query(None),
                 wait_s: float = Query(0.0, ge=0.0, le=60.0), delta: bool = Query(False)) -> Response:
    # Long poll: answer as soon as the table's version passes `since` (at once for a
    # watcher that knew another epoch), or after wait_s; None before the fleet is adopted.
    # `delta`: the watcher merges deltas (only what changed since `since`, when recent).
    table = await manager.feed.wait(since, epoch, wait_s, delta=delta)
    if table is None:
        return JSONResponse({"error": "the controller is adopting the fleet after its start; retry shortly"},
                            status_code=503, headers={"Retry-After": "1"})
    return Response(table.body(), media_type="application/json")
