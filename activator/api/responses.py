"""OpenAI's Responses API routes (``activator.conversations.responses``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from activator.api.calls import engine_call, tenant_call
from activator.api.parts import Parts
from activator.conversations.responses import CREATE_BODY
from activator.protocol import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/responses", responses=ERROR_RESPONSES, openapi_extra=CREATE_BODY)
async def create_response(request: Request, parts: Parts) -> Response:
    return await engine_call(parts, request, "responses", lambda ctx: parts.responses.create(request, ctx))


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def get_response(response_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.responses.get(tenant, response_id), "responses")


@router.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(response_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.responses.delete(tenant, response_id),
                             "responses")


@router.get("/v1/responses/{response_id}/input_items", responses=ERROR_RESPONSES)
async def response_input_items(response_id: str, request: Request, parts: Parts, after: str | None = None,
                               limit: Annotated[int, Query(ge=1, le=100)] = 20,
                               order: Literal["asc", "desc"] = "desc") -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.responses.input_items(
        tenant, response_id, after=after, limit=limit, order=order), "responses")
