"""OpenAI's Batches API, per tenant: ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``GET /v1/batches`` (``after``, ``limit``) and ``POST /v1/batches/{id}/cancel``.

The batch itself lives at the controller (``warm_pool.batch.store``, run by its
``batch_runner``); this module checks a request as OpenAI does, asks the controller for
the tenant it authenticated, and shows the batch in OpenAI's shape. The lines run on
this activator's spare slots (``activator.batch.worker``). Another tenant's batch id
answers 404 exactly as an unknown one.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import ValidationError

from activator.errors import BadRequest, ObjectNotFound, ServiceUnavailable
from thaw.controllers import ControllerClient
from thaw.log import get_logger
from thaw.wire import BATCH_ENDPOINTS, BatchList, BatchRecord, NewBatch

log = get_logger()


# /openapi.json's body of POST /v1/batches (the route reads the raw body itself).
CREATE_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False,
    "required": ["input_file_id", "endpoint", "completion_window"],
    "properties": {
        "input_file_id": {"type": "string", "description": "A file uploaded with purpose 'batch'"},
        "endpoint": {"type": "string", "enum": list(BATCH_ENDPOINTS)},
        "completion_window": {"type": "string", "enum": ["24h"]},
        "metadata": {"type": "object", "maxProperties": 16,
                     "additionalProperties": {"type": "string", "maxLength": 512}},
    }}}}}}


def _ts(value: float | None) -> int | None:
    return None if value is None else int(value)


def batch_object(b: BatchRecord) -> dict[str, Any]:
    """The batch as OpenAI's API shows it."""
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "input_file_id": b.input_file_id,
        "completion_window": b.completion_window, "status": b.status,
        "errors": {"object": "list", "data": [e.model_dump() for e in b.errors]} if b.errors else None,
        "output_file_id": b.output_file_id, "error_file_id": b.error_file_id, "created_at": int(b.created_at),
        "in_progress_at": _ts(b.in_progress_at), "expires_at": _ts(b.expires_at),
        "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at), "failed_at": _ts(b.failed_at),
        "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at), "cancelled_at": _ts(b.cancelled_at),
        "request_counts": b.request_counts.model_dump(), "metadata": b.metadata,
    }


class BatchesApi:
    def __init__(self, controller: ControllerClient) -> None:
        self.controller = controller

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.controller.answer(method, path, **kw)
        if r is None:
            raise ServiceUnavailable("batches (the controller) cannot be reached now; retry",
                                     code="batches_unavailable", retry_after_s=2)
        return r

    async def create(self, tenant: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if name not in body:
                raise BadRequest(f"'{name}' is required", param=name)
        if body["endpoint"] not in BATCH_ENDPOINTS:
            raise BadRequest(f"endpoint {body['endpoint']!r} is not supported: one of {list(BATCH_ENDPOINTS)}",
                             param="endpoint")
        if body["completion_window"] != "24h":
            raise BadRequest("completion_window must be '24h'", param="completion_window")
        extra = set(body) - {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}
        if extra:
            raise BadRequest(f"unknown parameter {sorted(extra)[0]!r}", param=sorted(extra)[0])
        try:
            new = NewBatch(tenant=tenant, input_file_id=body["input_file_id"], endpoint=body["endpoint"],
                           completion_window=body["completion_window"], metadata=body.get("metadata"))
        except ValidationError as exc:
            first = exc.errors()[0]
            param = str(first["loc"][0]) if first.get("loc") else None
            if param == "input_file_id":
                raise BadRequest(f"No such File object: {body['input_file_id']}", param=param) from None
            raise BadRequest(f"{param}: {first['msg']}", param=param) from None
        r = await self._call("POST", "/v1/batches", content=new.model_dump_json(),
                             headers={"content-type": "application/json"})
        if r.status_code == 400:
            raise BadRequest(r.json().get("error", "the input file cannot be used"), param="input_file_id")
        if r.status_code != 201:
            log.warning("batch_not_created", status=r.status_code, body=r.text[:300])
            raise ServiceUnavailable("the batch could not be created now; retry", code="batches_unavailable",
                                     retry_after_s=2)
        return batch_object(BatchRecord.model_validate_json(r.content))

    async def get(self, tenant: str, batch_id: str) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/batches/{_safe(batch_id)}", params={"tenant": tenant})
        if r.status_code == 404:
            raise ObjectNotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return batch_object(BatchRecord.model_validate_json(r.content))

    async def list(self, tenant: str, *, after: str | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"tenant": tenant, "limit": limit}
        if after is not None:
            params["after"] = after
        page = BatchList.model_validate_json((await self._call("GET", "/v1/batches", params=params)).content)
        data = [batch_object(b) for b in page.data]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": page.has_more}

    async def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        r = await self._call("POST", f"/v1/batches/{_safe(batch_id)}/cancel", params={"tenant": tenant})
        if r.status_code == 404:
            raise ObjectNotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return batch_object(BatchRecord.model_validate_json(r.content))


def _safe(batch_id: str) -> str:
    """A batch id as a path segment: one of ours, else an id no batch has."""
    return batch_id if batch_id.replace("_", "").isalnum() else "batch_none"
