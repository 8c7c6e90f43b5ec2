"""The activator's HTTP app: ``create_app`` builds its parts once (``app.state.parts``)
and mounts the routers of ``activator.api``, which call them.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from activator.api import batches, completions, conversations, files, models, ops, responses, usage
from activator.api.calls import install_error_handlers
from activator.api.completions import completion
from activator.api.parts import ActivatorParts
from activator.auth import Authenticator
from activator.batch.batches import BatchesApi
from activator.batch.files import FilesApi
from activator.batch.worker import BatchWorker
from activator.bounds import RequestBounds
from activator.catalog import CatalogCache, apply_catalog
from activator.conversations.conversations import ConversationsApi
from activator.conversations.responses import ResponsesApi
from activator.edge import CompletionEdge, RequestGuard
from activator.keys import KeyCache
from activator.keys import split as split_keys
from activator.ledger import Ledger
from activator.limits import build_limiter
from activator.metrics import ActivatorMetrics
from activator.protocol import add_request_schemas
from activator.routing.router import Router
from activator.service import CompletionService
from activator.shipping import UsageShipper
from activator.tokens import FileFetcher, TokenCounter
from activator.usage_store import UsageReader
from thaw.config import ThawConfig
from thaw.controllers import ControllerClient
from thaw.log import get_logger
from thaw.s3client import S3Client
from thaw.telemetry import shutdown, tracing_from
from thaw.wire import Catalog, KeyTable

log = get_logger()


def create_app(
    cfg: ThawConfig, pool_url: str, *, activator_id: str | None = None, store_fetcher: FileFetcher | None = None,
    token: str | None = None, usage_client: S3Client | None = None, files_client: Any = None, processes: int = 1,
) -> FastAPI:
    """The activator. ``store_fetcher`` reads a model's tokenizer files from the store
    (for prompt lengths); without it, prompt lengths are estimated and not checked.
    ``token``: the cluster token its calls to the controller carry. ``usage_client``:
    the store that its ledger is shipped to and fleet usage read from (none: /v1/usage
    answers from this activator's ledger alone). ``files_client``: the store the Files
    API keeps uploads in (none: it answers 503). ``processes``: how many worker
    processes of one `thaw activator --workers N` this is one of."""
    metrics = ActivatorMetrics(registry := CollectorRegistry())
    activator_id = activator_id or f"activator-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(cfg.ledger_path_for(activator_id), group_window_s=cfg.ledger.group_window_ms / 1000)

    def on_replica(up: bool, replica: str, model: str, at: float) -> None:
        if up:
            live = service.cfg
            m = live.model(model)
            shape = live.shape(m.shape) if m else None
            ledger.replica_up(replica, model, shape.gpu_count if shape else 0, at)
        else:
            ledger.replica_down(replica, at)

    # Keys added or revoked with `thaw tenants` (at the controller): the last table this
    # activator was sent holds until the controller sends another, across restarts too.
    auth = Authenticator.from_config(cfg)
    key_cache = KeyCache(cfg.activator_dir(activator_id))
    known_keys = key_cache.load()
    if known_keys is not None:
        auth.update_dynamic(*split_keys(known_keys))

    async def on_keys(table: KeyTable) -> None:
        auth.update_dynamic(*split_keys(table))
        log.info("keys_updated", version=table.version, keys=len(table.keys))
        try:
            await asyncio.to_thread(key_cache.save, table)
        except OSError as exc:
            log.warning("key_cache_write_failed", path=str(key_cache.path), error=str(exc))

    # The models and tenants in force: the controller's catalog (the config file's until
    # the first one comes), the last one received across restarts too.
    catalog_cache = CatalogCache(cfg.activator_dir(activator_id))
    known_catalog = catalog_cache.load()
    if known_catalog is not None:
        cfg = apply_catalog(cfg, known_catalog)
        auth.update_catalog(cfg.tenants, cfg.models)

    async def on_catalog(catalog: Catalog, answer: Catalog | None = None) -> None:
        """``catalog``: the whole one in force; ``answer``: the controller's answer it was
        merged from (a delta: the router takes in only the models it names)."""
        live = apply_catalog(service.cfg, catalog)
        service.use_config(live)
        auth.update_catalog(live.tenants, live.models)
        delta = answer if answer is not None and answer.base_version is not None else None
        if delta is not None:
            routes.change_models(delta.models, delta.removed)
        else:
            routes.set_models(live.models)
        log.info("catalog_updated", version=catalog.version, models=len(catalog.models),
                 tenants=len(catalog.tenants), changed=len(delta.models) if delta else None,
                 removed=len(delta.removed) if delta else None)
        try:
            await asyncio.to_thread(catalog_cache.save, catalog)
        except OSError as exc:
            log.warning("catalog_cache_write_failed", path=str(catalog_cache.path), error=str(exc))

    routes = Router(cfg.models, pool_url, activator_id, token=token, on_replica=on_replica,
                    ejection_s=cfg.server.replica_ejection_s,
                    on_keys=on_keys, keys_version=known_keys.version if known_keys else None,
                    on_catalog=on_catalog, catalog=known_catalog)
    tokens = TokenCounter(store_fetcher) if store_fetcher is not None else None
    # limits.backend redis: shared by every activator; while Redis is away, this one's
    # share is the limit over the activators the controller hears from.
    limiter = build_limiter(cfg.limits, metrics, owner=activator_id, activators=lambda: routes.feed.activators,
                            processes=processes)
    tracing = tracing_from(cfg.telemetry, "thaw-activator")  # None: off
    service = CompletionService(cfg, auth, routes, metrics, ledger, tokens, limiter=limiter, tracing=tracing)
    bucket, prefix = cfg.object_store.bucket, cfg.ledger.ship_prefix
    shipper = (UsageShipper(ledger.path, activator_id, usage_client, bucket, prefix=prefix,
                            interval_s=cfg.ledger.ship_interval_s, max_records=cfg.ledger.ship_max_records,
                            metrics=metrics)
               if usage_client is not None and cfg.ledger.ship else None)
    usage_reader = UsageReader(usage_client, bucket, prefix) if usage_client is not None else None
    controller = ControllerClient(pool_url, token)  # the Files and Batches APIs' calls
    batch_worker = BatchWorker(service, routes, controller, activator_id, cfg.batch)

    parts = ActivatorParts(
        activator_id=activator_id, service=service, routes=routes, metrics=metrics, registry=registry,
        ledger=ledger, usage_reader=usage_reader, files=FilesApi(cfg.batch, bucket, files_client, controller),
        batches=BatchesApi(controller), responses=ResponsesApi(service, controller),
        conversations=ConversationsApi(controller),
        metrics_authorization=f"Bearer {token}".encode() if token else None)
    app = _app(cfg, parts, _lifespan(cfg, routes, limiter, batch_worker, shipper, tokens, controller, service, ledger))
    # For tests and tools that look inside.
    for name, value in {"cfg": cfg, "activator_id": activator_id, "routes": routes, "service": service,
                        "limiter": limiter, "metrics": metrics, "ledger": ledger, "shipper": shipper,
                        "usage_reader": usage_reader}.items():
        setattr(app.state, name, value)
    return app


def _app(cfg: ThawConfig, parts: ActivatorParts,
         lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]]) -> FastAPI:
    """The FastAPI app over ``parts``: its routers, error handlers and middleware."""
    app = FastAPI(title="thaw activator", lifespan=lifespan, docs_url=None, redoc_url=None)
    # The completion routes read their bodies raw (size limit); /openapi.json still
    # documents them, from activator.protocol's models.
    fastapi_openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or add_request_schemas(fastapi_openapi())  # type: ignore[method-assign]
    app.state.parts = parts
    install_error_handlers(app)
    # The completion endpoints' traffic takes the short way (activator.edge); the routes
    # document them in /openapi.json and serve them if the edge is not in front.
    app.add_middleware(CompletionEdge, handler=functools.partial(completion, parts))
    # In front of both (added last: outermost of the two): header bounds, body deadline.
    app.add_middleware(RequestGuard, bounds=RequestBounds.from_server(cfg.server),
                       body_timeout_s=cfg.server.body_timeout_s,
                       slow_bodies={("POST", "/v1/files"): cfg.batch.upload_timeout_s})
    for api in (completions, models, usage, files, batches, responses, conversations, ops):
        app.include_router(api.router)
    return app


def _lifespan(cfg: ThawConfig, routes: Router, limiter: Any, batch_worker: BatchWorker,
              shipper: UsageShipper | None, tokens: TokenCounter | None, controller: ControllerClient,
              service: CompletionService, ledger: Ledger) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What starts with the app and stops with it, in order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await routes.start()
        await limiter.start()
        await batch_worker.start()
        if shipper is not None:
            await shipper.start()
        prefetch = (asyncio.create_task(tokens.prefetch(cfg.engine_model(m).uri for m in cfg.models),
                                        name="tokenizer_prefetch")
                    if tokens is not None else None)
        # What exists now (modules, the app, config) lives as long as the process: out of
        # the collector's sight, full collections stay short under load (tail latency).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            if prefetch is not None:
                prefetch.cancel()
                await asyncio.gather(prefetch, return_exceptions=True)
            await batch_worker.close()
            await routes.close()
            await controller.aclose()
            await service.close()
            await limiter.close()
            ledger.close()
            if shipper is not None:
                await shipper.close()  # after the ledger's last commit
            await shutdown(service.tracing)

    return lifespan
