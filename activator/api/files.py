"""OpenAI's Files API routes (``activator.batch.files`` does the work)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from activator.api.calls import tenant_call
from activator.api.parts import Parts
from activator.batch.files import UPLOAD_BODY, file_object
from activator.protocol import ERROR_RESPONSES

router = APIRouter()


@router.post("/v1/files", responses=ERROR_RESPONSES, openapi_extra=UPLOAD_BODY)
async def upload_file(request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.files.upload(tenant, request), "files")


@router.get("/v1/files", responses=ERROR_RESPONSES)
async def list_files(request: Request, parts: Parts, purpose: str | None = None, after: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                     order: Literal["asc", "desc"] = "desc") -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.files.list(
        tenant, purpose=purpose, after=after, limit=limit, order=order), "files")


@router.get("/v1/files/{file_id}", responses=ERROR_RESPONSES)
async def get_file(file_id: str, request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> dict[str, Any]:
        return file_object(await parts.files.record(tenant, file_id))

    return await tenant_call(parts, request, call, "files")


@router.get("/v1/files/{file_id}/content", responses=ERROR_RESPONSES)
async def file_content(file_id: str, request: Request, parts: Parts) -> Response:
    async def call(tenant: str) -> Response:
        record, chunks = await parts.files.content(tenant, file_id)
        return StreamingResponse(chunks, media_type="application/octet-stream", headers={
            "content-length": str(record.bytes),
            "content-disposition": f'attachment; filename="{quote(record.filename)}"'})

    return await tenant_call(parts, request, call, "files")


@router.delete("/v1/files/{file_id}", responses=ERROR_RESPONSES)
async def delete_file(file_id: str, request: Request, parts: Parts) -> Response:
    return await tenant_call(parts, request, lambda tenant: parts.files.delete(tenant, file_id), "files")
