"""The operators' routes: ``/healthz`` and ``/metrics``.

The metrics name every model: on the tenants' port they are the operators' and need the
cluster token (Prometheus: ``authorization: {credentials: <token>}``), or a tenant would
learn which models other tenants have. Without a token (a bare ``create_app`` in tests
and tools) they are open."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from activator.api.parts import Parts
from activator.errors import Unauthorized
from activator.protocol import ErrorResponse

router = APIRouter()


@router.get("/healthz")
async def healthz(parts: Parts) -> dict[str, Any]:
    feed = parts.routes.feed
    catalog = feed.followed.get("catalog")
    # The route table's version it acts on, and the model catalog's it holds: the
    # controller's /healthz names the newest of each.
    return {"ok": True, "pool_connected": feed.connected, "routes_epoch": feed.epoch, "routes_version": feed.version,
            "catalog_version": catalog.held if catalog is not None else None}


@router.get("/metrics", response_class=PlainTextResponse,
            responses={401: {"model": ErrorResponse, "description": "No cluster token, or the wrong one"}})
async def metrics_endpoint(request: Request, parts: Parts) -> Response:
    expected = parts.metrics_authorization
    if expected is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
        raise Unauthorized("/metrics needs the cluster token (Authorization: Bearer <token>)",
                           code="cluster_token_required", headers={"WWW-Authenticate": "Bearer"})
    for m in parts.service.cfg.models:
        st = parts.routes.status(m.name)
        parts.metrics.replicas.labels(m.name, "ready").set(st.ready)
        parts.metrics.replicas.labels(m.name, "loading").set(st.loading)
        parts.metrics.queue_depth.labels(m.name).set(st.cold_queue)
    return Response(generate_latest(parts.registry), media_type=CONTENT_TYPE_LATEST)
