"""``POST /v1/chat/completions`` and ``/v1/completions``, and the same under
``/m/{model}/`` (a model named by the path). Their traffic takes the short way through
``activator.edge``, which calls :func:`completion` itself; these routes document them
in ``/openapi.json`` and serve them when the edge is not in front."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from activator.api.calls import engine_call
from activator.api.parts import ActivatorParts, Parts
from activator.edge import IncomingRequest
from activator.protocol import ERROR_RESPONSES, request_body
from activator.service import Kind

router = APIRouter()


async def completion(parts: ActivatorParts, request: IncomingRequest, kind: Kind, path_model: str | None) -> Response:
    return await engine_call(parts, request, kind, lambda ctx: parts.service.handle(request, kind, ctx, path_model))


@router.post("/v1/chat/completions", openapi_extra=request_body("chat", model_in_path=False),
             responses=ERROR_RESPONSES)
async def chat(request: Request, parts: Parts) -> Response:
    return await completion(parts, request, "chat", None)


@router.post("/v1/completions", openapi_extra=request_body("completions", model_in_path=False),
             responses=ERROR_RESPONSES)
async def completions(request: Request, parts: Parts) -> Response:
    return await completion(parts, request, "completions", None)


@router.post("/m/{model}/v1/chat/completions", openapi_extra=request_body("chat", model_in_path=True),
             responses=ERROR_RESPONSES)
async def chat_for(model: str, request: Request, parts: Parts) -> Response:
    return await completion(parts, request, "chat", model)


@router.post("/m/{model}/v1/completions", openapi_extra=request_body("completions", model_in_path=True),
             responses=ERROR_RESPONSES)
async def completions_for(model: str, request: Request, parts: Parts) -> Response:
    return await completion(parts, request, "completions", model)
