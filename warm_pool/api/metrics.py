"""``/metrics``: the controller's Prometheus metrics (``warm_pool.metrics``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from warm_pool.api.parts import Parts

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(parts: Parts) -> Response:
    return Response(generate_latest(parts.registry), media_type=CONTENT_TYPE_LATEST)
