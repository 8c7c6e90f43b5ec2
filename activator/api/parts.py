"""The activator's parts the routes call, built once by ``activator.app.create_app`` and
handed to each route by dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from activator.batch.batches import BatchesApi
from activator.batch.files import FilesApi
from activator.conversations.conversations import ConversationsApi
from activator.conversations.responses import ResponsesApi
from activator.ledger import Ledger
from activator.metrics import ActivatorMetrics
from activator.routing.router import Router
from activator.service import CompletionService
from activator.usage_store import UsageReader


@dataclass(frozen=True)
class ActivatorParts:
    activator_id: str
    service: CompletionService
    routes: Router
    metrics: ActivatorMetrics
    registry: CollectorRegistry
    ledger: Ledger
    usage_reader: UsageReader | None
    files: FilesApi
    batches: BatchesApi
    responses: ResponsesApi
    conversations: ConversationsApi
    # What /metrics asks for (``Authorization: Bearer <cluster token>``); None: open.
    metrics_authorization: bytes | None


def parts_of(request: Request) -> ActivatorParts:
    parts: ActivatorParts = request.app.state.parts
    return parts


Parts = Annotated[ActivatorParts, Depends(parts_of)]
