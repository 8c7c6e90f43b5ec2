"""``GET /v1/usage``: the caller's own usage records and their totals."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from activator.api.parts import Parts
from activator.edge import request_id_from
from activator.ledger import parse_time, usage_totals
from activator.protocol import ERROR_RESPONSES
from activator.usage_store import read_usage
from thaw.log import get_logger

log = get_logger()
router = APIRouter()


@router.get("/v1/usage", responses=ERROR_RESPONSES)
async def usage(request: Request, parts: Parts, since: str | None = None, until: str | None = None) -> Response:
    """The caller's own usage records (never another tenant's) and their totals, from
    every activator's shipped segments and this one's ledger, with the shipping lag."""
    rid = request_id_from(request)
    principal = parts.service.principal(request)
    lo, hi = parse_time(since, "since"), parse_time(until, "until")
    fleet = await asyncio.to_thread(read_usage, parts.usage_reader, {parts.activator_id: parts.ledger.path},
                                    tenant=principal.tenant, since=lo, until=hi)
    reason = fleet.reason
    if not fleet.complete and parts.usage_reader is not None:
        # The store's error names its endpoint: for the log, not for API callers.
        log.warning("usage_store_unreadable", error=fleet.reason)
        reason = "the usage other activators shipped could not be read: this activator's records only"
    # Which activator (a host name) holds which record is the operators' business.
    data = [{k: v for k, v in r.items() if k not in ("activator", "id")} for r in fleet.records]
    return JSONResponse({"object": "list", "tenant": principal.tenant, "totals": usage_totals(fleet.records),
                         "data": data, "shipping": {"lag_s": fleet.shipping()["lag_s"]},
                         "complete": fleet.complete, "incomplete_reason": reason}, headers={"x-request-id": rid})
