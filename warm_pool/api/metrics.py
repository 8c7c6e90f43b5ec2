"""``/metrics``: the controller's Prometheus metrics (``warm_pool.metrics``)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from warm_pool.api.parts import Parts

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(parts: Parts) -> Response:
    # In a thread: with 10,000 models the per-model gauges are about 100,000 samples,
    # over a second of rendering that held the loop (turns, heartbeats, demand) for all
    # of it. The collectors read the last tick's published state, replaced whole.
    return Response(await asyncio.to_thread(generate_latest, parts.registry), media_type=CONTENT_TYPE_LATEST)
