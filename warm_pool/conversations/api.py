"""The controller's side of the Responses and Conversations APIs: the responses and
conversations activators store (``warm_pool.conversations.store``). Callers are activators,
with the cluster token; each names the tenant it authenticated, and answers about
another tenant's response or conversation are 404s."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from thaw.config import Name
from thaw.wire import (
    ConversationPatch,
    ErrorReply,
    ItemPage,
    NewConversation,
    NewItems,
    StoredResponse,
)
from warm_pool.api.errors import NotFound
from warm_pool.conversations.store import ResponseStore

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorReply, "description": "The tenant has no such response or conversation"}}
FULL: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorReply, "description": "The conversation is full, or the id is taken"}}


def _page(page: ItemPage) -> Response:
    return Response(page.model_dump_json(), media_type="application/json")


def responses_router(store: ResponseStore, clock: Callable[[], float]) -> APIRouter:
    """The routes of both APIs over ``store`` (``clock``: when a change is made)."""
    router = APIRouter()
    _response_routes(router, store, clock)
    _conversation_routes(router, store, clock)
    return router


def _response_routes(router: APIRouter, store: ResponseStore, clock: Callable[[], float]) -> None:
    """Stored responses: what a ``previous_response_id`` continues, and its input items."""

    @router.post("/v1/stored-responses", status_code=201, responses={**NOT_FOUND, **FULL})
    async def save(body: StoredResponse) -> Response:
        kept = await asyncio.to_thread(store.save, body.tenant, body.response.model_dump(),
                                       [i.model_dump() for i in body.input_items], replica=body.replica,
                                       at=clock(), conversation=body.conversation)
        if not kept:
            raise NotFound(f"no conversation {body.conversation!r}")
        return JSONResponse({"id": body.response.id}, status_code=201)

    @router.get("/v1/stored-responses/{response_id}", responses=NOT_FOUND)
    async def get(response_id: str, tenant: Name) -> Response:
        found = await asyncio.to_thread(store.get, tenant, response_id)
        if found is None:
            raise NotFound(f"no response {response_id!r}")
        return JSONResponse(found)

    @router.get("/v1/stored-responses/{response_id}/history", response_model=ItemPage, responses={
        **NOT_FOUND, 409: {"model": ErrorReply, "description": "The chain is too long to continue"}})
    async def history(response_id: str, tenant: Name) -> Response:
        found = await asyncio.to_thread(store.history, tenant, response_id)
        if found is None:
            raise NotFound(f"no response {response_id!r}")
        return _page(ItemPage(items=found[0], replica=found[1]))

    @router.get("/v1/stored-responses/{response_id}/input_items", response_model=ItemPage, responses=NOT_FOUND)
    async def input_items(response_id: str, tenant: Name) -> Response:
        found = await asyncio.to_thread(store.input_items, tenant, response_id)
        if found is None:
            raise NotFound(f"no response {response_id!r}")
        return _page(ItemPage(items=found))

    @router.delete("/v1/stored-responses/{response_id}", status_code=204, responses=NOT_FOUND)
    async def delete(response_id: str, tenant: Name) -> Response:
        gone = await asyncio.to_thread(store.delete, tenant, response_id)
        if not gone:
            raise NotFound(f"no response {response_id!r}")
        return Response(status_code=204)


def _conversation_routes(router: APIRouter, store: ResponseStore, clock: Callable[[], float]) -> None:
    """Stored conversations, their items in order."""

    def no_conversation(conversation_id: str) -> NotFound:
        return NotFound(f"no conversation {conversation_id!r}")

    @router.post("/v1/stored-conversations", status_code=201, responses=FULL)
    async def create_conversation(body: NewConversation) -> Response:
        made = await asyncio.to_thread(store.create_conversation, body.tenant, body.id, body.metadata,
                                       [i.model_dump() for i in body.items], clock())
        return JSONResponse(made, status_code=201)

    @router.get("/v1/stored-conversations/{conversation_id}", responses=NOT_FOUND)
    async def get_conversation(conversation_id: str, tenant: Name) -> Response:
        found = await asyncio.to_thread(store.conversation, tenant, conversation_id)
        if found is None:
            raise no_conversation(conversation_id)
        return JSONResponse(found)

    @router.post("/v1/stored-conversations/{conversation_id}", responses=NOT_FOUND)
    async def update_conversation(conversation_id: str, tenant: Name, body: ConversationPatch) -> Response:
        found = await asyncio.to_thread(store.update_conversation, tenant, conversation_id, body.metadata, clock())
        if found is None:
            raise no_conversation(conversation_id)
        return JSONResponse(found)

    @router.delete("/v1/stored-conversations/{conversation_id}", status_code=204, responses=NOT_FOUND)
    async def delete_conversation(conversation_id: str, tenant: Name) -> Response:
        gone = await asyncio.to_thread(store.delete_conversation, tenant, conversation_id)
        if not gone:
            raise no_conversation(conversation_id)
        return Response(status_code=204)

    @router.get("/v1/stored-conversations/{conversation_id}/items", response_model=ItemPage, responses=NOT_FOUND)
    async def list_items(conversation_id: str, tenant: Name, after: str | None = None,
                         limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
                         order: Literal["asc", "desc"] = "asc") -> Response:
        kw: dict[str, Any] = {"after": after, "order": order}
        if limit is not None:
            kw["limit"] = limit
        found = await asyncio.to_thread(lambda: store.conversation_items(tenant, conversation_id, **kw))
        if found is None:
            raise no_conversation(conversation_id)
        return _page(ItemPage(items=found[0], has_more=found[1], replica=found[2]))

    @router.post("/v1/stored-conversations/{conversation_id}/items", response_model=ItemPage,
                 responses={**NOT_FOUND, **FULL})
    async def add_items(conversation_id: str, tenant: Name, body: NewItems) -> Response:
        added = await asyncio.to_thread(store.add_items, tenant, conversation_id,
                                        [i.model_dump() for i in body.items], clock())
        if added is None:
            raise no_conversation(conversation_id)
        return _page(ItemPage(items=added))

    @router.get("/v1/stored-conversations/{conversation_id}/items/{item_id}", responses=NOT_FOUND)
    async def get_item(conversation_id: str, item_id: str, tenant: Name) -> Response:
        found = await asyncio.to_thread(store.conversation_item, tenant, conversation_id, item_id)
        if found is None:
            raise NotFound(f"no item {item_id!r}")
        return JSONResponse(found)

    @router.delete("/v1/stored-conversations/{conversation_id}/items/{item_id}", status_code=204,
                   responses=NOT_FOUND)
    async def delete_item(conversation_id: str, item_id: str, tenant: Name) -> Response:
        gone = await asyncio.to_thread(store.delete_item, tenant, conversation_id, item_id, clock())
        if not gone:
            raise NotFound(f"no item {item_id!r}")
        return Response(status_code=204)
