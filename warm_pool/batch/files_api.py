"""The controller's side of the Files API: the index activators keep files in
(``warm_pool.batch.files``). Callers are activators, with the cluster token; each names the
tenant it authenticated, and answers about another tenant's file are 404s."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from thaw.config import Name
from thaw.wire import ErrorReply, FileList, FileRecord, NewFile
from warm_pool.api.errors import NotFound
from warm_pool.batch.files import MAX_PAGE, FileIndex

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorReply, "description": "The tenant has no such file"}}


def files_router(index: FileIndex, clock: Callable[[], float]) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/files", response_model=FileRecord, status_code=201,
                 responses={409: {"model": ErrorReply, "description": "The id is indexed already"}})
    async def add(body: NewFile) -> Response:
        record = await asyncio.to_thread(index.add, body, clock())  # FileExists: 409
        return Response(record.model_dump_json(), status_code=201, media_type="application/json")

    @router.get("/v1/files", response_model=FileList)
    async def list_files(tenant: Name, purpose: str | None = None, after: str | None = None,
                         limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
                         order: Literal["asc", "desc"] = "desc") -> Response:
        page = await asyncio.to_thread(index.list, tenant, purpose=purpose, after=after, limit=limit, order=order)
        return Response(page.model_dump_json(), media_type="application/json")

    @router.get("/v1/files/{file_id}", response_model=FileRecord, responses=NOT_FOUND)
    async def get(file_id: str, tenant: Name) -> Response:
        record = await asyncio.to_thread(index.get, tenant, file_id)
        if record is None:
            raise NotFound(f"no file {file_id!r}")
        return Response(record.model_dump_json(), media_type="application/json")

    @router.delete("/v1/files/{file_id}", response_model=FileRecord, responses=NOT_FOUND)
    async def remove(file_id: str, tenant: Name) -> Response:
        record = await asyncio.to_thread(index.remove, tenant, file_id)
        if record is None:
            raise NotFound(f"no file {file_id!r}")
        return Response(record.model_dump_json(), media_type="application/json")

    return router
