"""The controller's side of the Batches API (``warm_pool.batch.store``, run by
``warm_pool.batch.runner``). Callers are activators, with the cluster token: they create,
read and cancel batches for the tenant they authenticated (another tenant's batch is a
404), lease batch requests to run and send their answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from thaw.config import Name
from thaw.wire import (
    BatchList,
    BatchRecord,
    BatchStatus,
    ErrorReply,
    LeasedLines,
    LeaseLines,
    LineResult,
    LineResultReply,
    NewBatch,
    ReleaseLine,
)
from warm_pool.api.errors import BadRequest, NotFound, Unprocessable
from warm_pool.batch.files import FileIndex
from warm_pool.batch.runner import BatchRunner
from warm_pool.batch.store import MAX_PAGE, BatchStore, new_batch_id

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorReply, "description": "The tenant has no such batch"}}


def _json(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def batch_router(store: BatchStore, files: FileIndex, runner: BatchRunner, clock: Callable[[], float]) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/batches", response_model=BatchRecord, status_code=201,
                 responses={400: {"model": ErrorReply, "description": "The input file is not the tenant's batch input"}})
    async def create(body: NewBatch) -> Response:
        found = await asyncio.to_thread(files.get, body.tenant, body.input_file_id)
        if found is None:
            raise BadRequest(f"No such File object: {body.input_file_id}")
        if found.purpose != "batch":
            raise BadRequest(f"file {body.input_file_id} has purpose {found.purpose!r}, not 'batch'")
        record = await asyncio.to_thread(store.create, body, new_batch_id(), clock())
        runner.kick()
        return _json(record, 201)

    @router.get("/v1/batches", response_model=BatchList)
    async def list_batches(tenant: Name, after: str | None = None,
                           limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20) -> Response:
        return _json(await asyncio.to_thread(store.page, tenant, after=after, limit=limit))

    @router.get("/v1/batches/{batch_id}", response_model=BatchRecord, responses=NOT_FOUND)
    async def get(batch_id: str, tenant: Name) -> Response:
        record = await asyncio.to_thread(store.get, tenant, batch_id)
        if record is None:
            raise NotFound(f"No such Batch object: {batch_id}")
        return _json(record)

    @router.post("/v1/batches/{batch_id}/cancel", response_model=BatchRecord, responses=NOT_FOUND)
    async def cancel(batch_id: str, tenant: Name) -> Response:
        record = await asyncio.to_thread(store.cancel, tenant, batch_id, clock())
        if record is None:
            raise NotFound(f"No such Batch object: {batch_id}")
        runner.kick()
        return _json(record)

    # -- the operators' view (`thaw batches`; an admin key opens /v1/admin/) ------------

    @router.get("/v1/admin/batches", response_model=BatchList)
    async def every(tenant: Name | None = None, status: BatchStatus | None = None,
                    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE) -> Response:
        found = await asyncio.to_thread(store.every, tenant=tenant, status=status, limit=limit)
        return _json(BatchList(data=found, has_more=len(found) == limit))

    @router.get("/v1/admin/batches/{batch_id}", response_model=BatchRecord, responses=NOT_FOUND)
    async def show(batch_id: str) -> Response:
        record = await asyncio.to_thread(store.get, None, batch_id)
        if record is None:
            raise NotFound(f"no batch {batch_id!r}")
        return _json(record)

    @router.post("/v1/admin/batches/{batch_id}/cancel", response_model=BatchRecord, responses=NOT_FOUND)
    async def cancel_any(batch_id: str) -> Response:
        found = await asyncio.to_thread(store.get, None, batch_id)
        if found is None:
            raise NotFound(f"no batch {batch_id!r}")
        record = await asyncio.to_thread(store.cancel, found.tenant, batch_id, clock())
        runner.kick()
        return _json(record)

    @router.post("/v1/batch-lines/lease", response_model=LeasedLines)
    async def lease(body: LeaseLines) -> Response:
        lines = await asyncio.to_thread(store.lease, body.owner, body.models, body.n, clock(), body.lease_s,
                                        renew=[(r.batch_id, r.line) for r in body.running])
        return _json(LeasedLines(lines=lines))

    @router.post("/v1/batch-lines/{batch_id}/{line}/result", response_model=LineResultReply,
                 responses={422: {"model": ErrorReply, "description": "Neither or both of response and error"}})
    async def result(batch_id: str, line: Annotated[int, Path(ge=1, le=2**31)], body: LineResult) -> Response:
        if (body.response is None) == (body.error is None):
            raise Unprocessable("give exactly one of response and error")
        kept = await asyncio.to_thread(store.finish, batch_id, line, response=body.response, error=body.error,
                                       at=clock())
        runner.kick()
        return _json(LineResultReply(kept=kept))

    @router.post("/v1/batch-lines/{batch_id}/{line}/release", status_code=204)
    async def release(batch_id: str, line: Annotated[int, Path(ge=1, le=2**31)], body: ReleaseLine) -> Response:
        await asyncio.to_thread(store.release, batch_id, line, body.owner, failure=body.failure, at=clock())
        return Response(status_code=204)

    return router
