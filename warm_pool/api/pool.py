"""The operators' view of the pool and what they change at run time: its status
(``warm_pool.status``), the decision log (``warm_pool.events``), the budgets
(``warm_pool.registry.admin``) and the controller's clock (``warm_pool.clock``)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from thaw.wire import BudgetChange, BudgetView, ClockStep, ClockView, PoolEvents, PoolStatus
from warm_pool.api.errors import refusal_doc
from warm_pool.api.parts import Actor, Manager, Parts
from warm_pool.persist import BudgetRefused

router = APIRouter()


@router.get("/v1/state", response_model=PoolStatus)
async def state(manager: Manager) -> Response:
    return Response(manager.status().model_dump_json(), media_type="application/json")


@router.get("/v1/events", response_model=PoolEvents)
async def events(manager: Manager, since: float = Query(0.0), history: bool = Query(False)) -> Response:
    # history: the decision log in the state database, every leader's (each event
    # names its controller and term); else this controller's recent events.
    found = (await manager.event_history(since) if history
             else [e for e in manager.parts.event_log.events if e.at >= since])
    return Response(PoolEvents(events=found).model_dump_json(), media_type="application/json")


@router.get("/v1/pool/budget", response_model=BudgetView)
async def budget(parts: Parts) -> Response:
    return Response(parts.budgets.view().model_dump_json(), media_type="application/json")


@router.put("/v1/pool/budget", response_model=BudgetView,
            responses={404: refusal_doc("No pool of that shape")})
async def set_budget(body: BudgetChange, parts: Parts, who: Actor) -> Response:
    try:
        view = await parts.budgets.change(body, who)
    except BudgetRefused as exc:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)
    return Response(view.model_dump_json(), media_type="application/json")


# The controller's clock (warm_pool.clock): stepped, when controller.stepped_clock.
@router.get("/v1/pool/clock", response_model=ClockView)
async def clock(parts: Parts) -> Response:
    return Response(parts.clock_admin.view().model_dump_json(), media_type="application/json")


@router.post("/v1/pool/clock", response_model=ClockView,
             responses={409: refusal_doc("This controller keeps the wall clock (controller.stepped_clock is false)"),
                        422: refusal_doc("A step the workers' heartbeats would read as silence")})
async def step_clock(body: ClockStep, parts: Parts, who: Actor) -> Response:
    return Response(parts.clock_admin.advance(body, who).model_dump_json(), media_type="application/json")
