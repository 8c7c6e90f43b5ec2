"""The workers' heartbeats (``warm_pool.fleet.facts``, answered with the leader's term)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from thaw.wire import HeartbeatReply, WorkerStatus
from warm_pool.api.errors import refusal_doc
from warm_pool.api.parts import Manager

router = APIRouter()


@router.post("/v1/workers/heartbeat", response_model=HeartbeatReply,
             responses={403: refusal_doc("An instance this controller did not launch, or one it is terminating")})
async def heartbeat(body: WorkerStatus, manager: Manager) -> Response:
    return JSONResponse(manager.heartbeat(body).model_dump(mode="json"))
