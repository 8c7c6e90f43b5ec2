"""OpenAI's Conversations API routes (``activator.conversations.conversations``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from activator.api.calls import json_body, tenant_call
from activator.api.parts import Parts
from activator.conversations.conversations import CONVERSATION_BODY, ITEMS_BODY, METADATA_BODY
from activator.protocol import ERROR_RESPONSES

router = APIRouter()
KIND = "conversations"


@router.post("/v1/conversations", responses=ERROR_RESPONSES, openapi_extra=CONVERSATION_BODY)
async def create_conversation(request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> dict[str, Any]:
        return await parts.conversations.create(tenant, await json_body(request))

    return await tenant_call(parts, request, call, KIND)


@router.get("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES)
async def get_conversation(conversation_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.conversations.get(tenant, conversation_id), KIND)


@router.post("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES, openapi_extra=METADATA_BODY)
async def update_conversation(conversation_id: str, request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> dict[str, Any]:
        return await parts.conversations.update(tenant, conversation_id, await json_body(request))

    return await tenant_call(parts, request, call, KIND)


@router.delete("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES)
async def delete_conversation(conversation_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.conversations.delete(tenant, conversation_id),
                             KIND)


@router.get("/v1/conversations/{conversation_id}/items", responses=ERROR_RESPONSES)
async def conversation_items(conversation_id: str, request: Request, parts: Parts, after: str | None = None,
                             limit: Annotated[int, Query(ge=1, le=100)] = 20,
                             order: Literal["asc", "desc"] = "desc") -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.conversations.list_items(
        tenant, conversation_id, after=after, limit=limit, order=order), KIND)


@router.post("/v1/conversations/{conversation_id}/items", responses=ERROR_RESPONSES, openapi_extra=ITEMS_BODY)
async def add_conversation_items(conversation_id: str, request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> dict[str, Any]:
        return await parts.conversations.add_items(tenant, conversation_id, await json_body(request))

    return await tenant_call(parts, request, call, KIND)


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERROR_RESPONSES)
async def get_conversation_item(conversation_id: str, item_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.conversations.get_item(
        tenant, conversation_id, item_id), KIND)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERROR_RESPONSES)
async def delete_conversation_item(conversation_id: str, item_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.conversations.delete_item(
        tenant, conversation_id, item_id), KIND)
