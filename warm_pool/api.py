"""The pool manager's HTTP API: activators report traffic and long-poll routes; ops read state.

Routers hold no logic: each endpoint hands over to ``PoolManager``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, NonNegativeInt

from warm_pool.manager import PoolManager
from warm_pool.policy import ModelActivity


class ModelReport(BaseModel):
    queued: NonNegativeInt = 0
    in_flight: NonNegativeInt = 0
    last_request_at: float | None = None


class ActivityReport(BaseModel):
    activator_id: str = Field(min_length=1, max_length=200)
    models: dict[str, ModelReport]


class DemandSignal(BaseModel):
    model: str


class ColdStartRecord(BaseModel):
    model: str
    request_id: str
    at: float
    total_s: float
    phases_s: dict[str, float]
    woken: bool = False


def create_pool_app(manager: PoolManager, *, manage_lifecycle: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await manager.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await manager.close()

    app = FastAPI(title="thaw pool manager", lifespan=lifespan)
    app.state.manager = manager

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/reports", status_code=204)
    async def report(body: ActivityReport) -> Response:
        manager.report(body.activator_id, {
            name: ModelActivity(r.queued, r.in_flight, r.last_request_at) for name, r in body.models.items()
        })
        return Response(status_code=204)

    @app.post("/v1/demand", status_code=202)
    async def demand(body: DemandSignal) -> JSONResponse:
        if manager.cfg.model(body.model) is None:
            return JSONResponse({"error": f"unknown model {body.model!r}"}, status_code=404)
        manager.demand(manager.cfg.model(body.model).name)  # type: ignore[union-attr]
        return JSONResponse({"accepted": True}, status_code=202)

    @app.post("/v1/cold_starts", status_code=204)
    async def cold_start(body: ColdStartRecord) -> Response:
        manager.record_cold_start(body.model, body.model_dump())
        return Response(status_code=204)

    @app.get("/v1/routes")
    async def routes(since: int = Query(-1), wait_s: float = Query(0.0, ge=0.0, le=60.0)) -> dict[str, Any]:
        # Long poll: answer as soon as the table's version passes `since`, or after wait_s.
        if wait_s > 0:
            return await manager.wait_routes(since, wait_s)
        return manager.routes

    @app.get("/v1/state")
    async def state() -> dict[str, Any]:
        return manager.status()

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(manager.registry), media_type=CONTENT_TYPE_LATEST)

    return app
