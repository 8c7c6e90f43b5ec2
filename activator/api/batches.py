"""OpenAI's Batches API routes (``activator.batch.batches``; lines run by
``activator.batch.worker``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from activator.api.calls import json_body, tenant_call
from activator.api.parts import Parts
from activator.batch.batches import CREATE_BODY
from activator.protocol import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/batches", responses=ERROR_RESPONSES, openapi_extra=CREATE_BODY)
async def create_batch(request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> dict[str, Any]:
        return await parts.batches.create(tenant, await json_body(request))

    return await tenant_call(parts, request, call, "batches")


@router.get("/v1/batches", responses=ERROR_RESPONSES)
async def list_batches(request: Request, parts: Parts, after: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.batches.list(tenant, after=after, limit=limit),
                             "batches")


@router.get("/v1/batches/{batch_id}", responses=ERROR_RESPONSES)
async def get_batch(batch_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.batches.get(tenant, batch_id), "batches")


@router.post("/v1/batches/{batch_id}/cancel", responses=ERROR_RESPONSES)
async def cancel_batch(batch_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.batches.cancel(tenant, batch_id), "batches")
