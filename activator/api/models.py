"""``GET /v1/models``, ``/v1/models/{model}`` and ``/m/{model}/v1/models``: the models
the caller may use, each with its state at this activator."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from activator.api.parts import ActivatorParts, Parts
from activator.edge import request_id_from
from activator.protocol import ERROR_RESPONSES
from activator.routing.router import public_failure

router = APIRouter()


def model_entry(parts: ActivatorParts, name: str) -> dict[str, Any]:
    m = parts.service.cfg.model(name)
    assert m is not None
    st = parts.routes.status(m.name)
    return {
        "id": m.resolved_served_name, "object": "model", "created": 0, "owned_by": "thaw",
        "max_model_len": m.max_context_tokens,
        "thaw": {"state": st.state, "replicas_ready": st.ready, "replicas_loading": st.loading,
                 "queue_depth": st.cold_queue,
                 "error": public_failure(st.failure_kind) if st.state == "failed" else None},
    }


def _list(parts: ActivatorParts, request: Request, only: str | None) -> Response:
    rid = request_id_from(request)
    service = parts.service
    principal = service.principal(request)
    if only is not None:
        model = service.resolve_model(principal, only)
        return JSONResponse({"object": "list", "data": [model_entry(parts, model.name)]},
                            headers={"x-request-id": rid})
    data = [model_entry(parts, m.name) for m in service.cfg.models if principal.may_use(m.name)]
    return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": rid})


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def models(request: Request, parts: Parts) -> Response:
    return _list(parts, request, None)


@router.get("/v1/models/{model:path}", responses=ERROR_RESPONSES)
async def model_by_id(model: str, request: Request, parts: Parts) -> Response:
    m = parts.service.resolve_model(parts.service.principal(request), model)
    return JSONResponse(model_entry(parts, m.name), headers={"x-request-id": request_id_from(request)})


@router.get("/m/{model}/v1/models", responses=ERROR_RESPONSES)
async def models_for(model: str, request: Request, parts: Parts) -> Response:
    return _list(parts, request, model)
