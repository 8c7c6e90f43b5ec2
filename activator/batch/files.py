"""OpenAI's Files API, per tenant: ``POST /v1/files`` (multipart, ``purpose=batch``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content`` and
``DELETE /v1/files/{id}``.

An upload is counted (bytes, lines) and bounded (``batch.max_file_bytes``,
``batch.max_file_lines``) as it is read, stored in the object store at
``<batch.files_prefix><tenant>/<id>``, then indexed at the controller
(``warm_pool.batch.files``); a file exists for the API once it is indexed, so an upload the
controller could not index is deleted again and refused (503), never half there. A
deletion takes the file out of the index first, then deletes its bytes. Another
tenant's file id answers 404 exactly as an unknown one.

The object store is blocking boto3, so every store call runs in a thread; the content
is streamed back a chunk at a time.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import IO, Any, Literal

import httpx
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from activator.errors import (
    ApiError,
    BadRequest,
    ObjectNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from thaw.config import BatchConfig
from thaw.controllers import ControllerClient
from thaw.log import get_logger
from thaw.wire import FILE_ID, FileList, FileRecord, NewFile

log = get_logger()

CHUNK = 1 << 20
# Room for a multipart form's boundaries and headers around the file.
FORM_OVERHEAD = 64 * 1024
MAX_FILENAME = 512
FILE_ID_RE = re.compile(FILE_ID)
# /openapi.json's body of POST /v1/files (the route reads the multipart body itself).
UPLOAD_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "JSONL, one request a line"},
                   "purpose": {"type": "string", "enum": ["batch"]}}}}}}}


def file_object(r: FileRecord) -> dict[str, Any]:
    """The file as OpenAI's API shows it (``status`` is deprecated there: always
    ``processed`` once it exists)."""
    return {"id": r.id, "object": "file", "bytes": r.bytes, "created_at": int(r.created_at), "filename": r.filename,
            "purpose": r.purpose, "status": "processed", "expires_at": None, "status_details": None}


def count_lines(f: IO[bytes], max_bytes: int) -> tuple[int, int]:
    """The bytes and lines (a last line without a newline counts) of ``f`` from its
    start; PayloadTooLarge as soon as it passes ``max_bytes``."""
    size = lines = 0
    last = b"\n"
    while chunk := f.read(CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"the file is over {max_bytes} bytes, the most a batch file may have",
                                  param="file", code="file_too_large")
        lines += chunk.count(b"\n")
        last = chunk[-1:]
    return size, lines + (last != b"\n")


def store_upload(client: Any, bucket: str, key: str, f: IO[bytes], cfg: BatchConfig) -> tuple[int, int]:
    """Count and bound an upload (from its start), then store it at ``key``; its bytes
    and lines. Blocking."""
    f.seek(0)
    size, lines = count_lines(f, cfg.max_file_bytes)
    if size == 0:
        raise BadRequest("the file is empty", param="file", code="empty_file")
    if lines > cfg.max_file_lines:
        raise BadRequest(f"the file has {lines} lines; a batch file may have at most {cfg.max_file_lines}",
                         param="file", code="too_many_lines")
    f.seek(0)
    client.upload_fileobj(f, bucket, key)
    return size, lines


class FilesApi:
    """The routes' work: ``client`` is a boto3 S3 client of the object store (None: no
    store is configured, and every call answers 503); ``controller``: the index's."""

    def __init__(self, cfg: BatchConfig, bucket: str, client: Any, controller: ControllerClient) -> None:
        self.cfg = cfg
        self.bucket = bucket
        self.client = client
        self.controller = controller

    def _store(self) -> Any:
        if self.client is None:
            raise ServiceUnavailable("files need the object store, and this activator has none configured",
                                     code="files_unavailable")
        return self.client

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.controller.answer(method, path, **kw)
        if r is None:
            raise ServiceUnavailable("the file index (the controller) cannot be reached now; retry",
                                     code="files_unavailable", retry_after_s=2)
        return r

    @staticmethod
    def _check_id(file_id: str) -> None:
        if not FILE_ID_RE.fullmatch(file_id):  # never one of ours: as an unknown one
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")

    # -- the routes ----------------------------------------------------------------------

    async def upload(self, tenant: str, request: Request) -> dict[str, Any]:
        client = self._store()
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.cfg.max_file_bytes + FORM_OVERHEAD:
            raise PayloadTooLarge(f"the file is over {self.cfg.max_file_bytes} bytes, the most a batch file may "
                                  "have", param="file", code="file_too_large")
        try:
            form = await request.form(max_files=1, max_fields=16)
        except MultiPartException as exc:
            raise BadRequest(f"the body is not a multipart form with the file: {exc.message}") from None
        except HTTPException as exc:  # starlette's form of the same in an app (e.g. no boundary)
            raise BadRequest(f"the body is not a multipart form with the file: {exc.detail}") from None
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                raise BadRequest("'file' is required: the file as a multipart file field", param="file")
            if purpose is None:
                raise BadRequest("'purpose' is required ('batch')", param="purpose")
            if purpose != "batch":
                raise BadRequest(f"purpose {purpose!r} is not supported: files here are batch input (purpose "
                                 "'batch')", param="purpose")
            filename = (upload.filename or "file").rsplit("/", 1)[-1][:MAX_FILENAME] or "file"
            file_id = f"file-{uuid.uuid4().hex}"
            key = f"{self.cfg.files_prefix}{tenant}/{file_id}"
            try:
                size, lines = await asyncio.to_thread(store_upload, client, self.bucket, key, upload.file, self.cfg)
            except ApiError:
                raise
            except Exception as exc:
                log.error("file_store_failed", file_id=file_id, key=key, error=repr(exc))
                raise ServiceUnavailable("the store cannot take the file now; retry", code="files_unavailable",
                                         retry_after_s=2) from None
        finally:
            await form.close()
        new = NewFile(id=file_id, tenant=tenant, filename=filename, purpose="batch", bytes=size, lines=lines, key=key)
        try:
            r = await self._call("POST", "/v1/files", content=new.model_dump_json(),
                                 headers={"content-type": "application/json"})
            if r.status_code != 201:
                raise RuntimeError(f"the controller answered {r.status_code}: {r.text[:300]}")
        except (Exception, asyncio.CancelledError) as exc:
            # Not indexed: not a file. Its bytes go again (a failure here leaves an
            # object nothing refers to, which is logged).
            log.warning("file_not_indexed", file_id=file_id, tenant=tenant, error=repr(exc))
            try:
                await asyncio.to_thread(client.delete_object, Bucket=self.bucket, Key=key)
            except Exception as gone:
                log.error("file_orphaned", file_id=file_id, key=key, error=repr(gone))
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ServiceUnavailable("the file could not be indexed, so it was not kept; retry",
                                     code="files_unavailable", retry_after_s=2) from None
        record = FileRecord.model_validate_json(r.content)
        log.info("file_stored", file_id=file_id, tenant=tenant, bytes=size, lines=lines)
        return file_object(record)

    async def list(self, tenant: str, *, purpose: str | None, after: str | None, limit: int,
                   order: Literal["asc", "desc"]) -> dict[str, Any]:
        self._store()
        params: dict[str, Any] = {"tenant": tenant, "limit": limit, "order": order}
        if purpose is not None:
            params["purpose"] = purpose
        if after is not None:
            params["after"] = after
        r = await self._call("GET", "/v1/files", params=params)
        page = FileList.model_validate_json(r.content)
        data = [file_object(f) for f in page.data]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}

    async def record(self, tenant: str, file_id: str) -> FileRecord:
        self._store()
        self._check_id(file_id)
        r = await self._call("GET", f"/v1/files/{file_id}", params={"tenant": tenant})
        if r.status_code == 404:
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")
        return FileRecord.model_validate_json(r.content)

    async def content(self, tenant: str, file_id: str) -> tuple[FileRecord, AsyncIterator[bytes]]:
        """The file and its bytes, read from the store a chunk at a time."""
        record = await self.record(tenant, file_id)
        client = self._store()
        try:
            body = (await asyncio.to_thread(client.get_object, Bucket=self.bucket, Key=record.key))["Body"]
        except Exception as exc:
            log.error("file_unreadable", file_id=file_id, key=record.key, error=repr(exc))
            raise ServiceUnavailable("the file's content cannot be read from the store now; retry",
                                     code="files_unavailable", retry_after_s=2) from None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := await asyncio.to_thread(body.read, CHUNK):
                    yield chunk
            finally:
                await asyncio.to_thread(body.close)

        return record, chunks()

    async def delete(self, tenant: str, file_id: str) -> dict[str, Any]:
        client = self._store()
        self._check_id(file_id)
        r = await self._call("DELETE", f"/v1/files/{file_id}", params={"tenant": tenant})
        if r.status_code == 404:
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")
        record = FileRecord.model_validate_json(r.content)
        try:
            await asyncio.to_thread(client.delete_object, Bucket=self.bucket, Key=record.key)
        except Exception as exc:  # gone from the API already; the bytes are left behind
            log.error("file_orphaned", file_id=file_id, key=record.key, error=repr(exc))
        log.info("file_deleted", file_id=file_id, tenant=tenant)
        return {"id": file_id, "object": "file", "deleted": True}
