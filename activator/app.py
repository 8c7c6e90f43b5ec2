"""The activator's HTTP app: thin routes over ``CompletionService`` and ``RouteWatcher``.

``create_app`` builds the object graph once and keeps it on ``app.state``.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from activator.auth import Authenticator
from activator.errors import (
    ApiError,
    BadRequest,
    NotFound,
    error_body,
    error_response,
    internal_error_response,
)
from activator.keys import snapshot as keys_snapshot
from activator.ledger import Ledger, parse_time, query_usage, usage_totals
from activator.metrics import ActivatorMetrics
from activator.routing import RouteWatcher
from activator.service import CompletionService, Kind, RequestContext, request_id_from
from activator.tokens import FileFetcher, TokenCounter
from thaw.config import ThawConfig
from thaw.log import bind_request, get_logger

log = get_logger()


def create_app(
    cfg: ThawConfig, pool_url: str, *, activator_id: str | None = None, store_fetcher: FileFetcher | None = None,
    token: str | None = None,
) -> FastAPI:
    """The activator. ``store_fetcher`` reads a model's tokenizer files from the store
    (for prompt lengths); without it, prompt lengths are estimated and not checked.
    ``token``: the cluster token its calls to the controller carry."""
    registry = CollectorRegistry()
    metrics = ActivatorMetrics(registry)
    ledger = Ledger(cfg.ledger_path, group_window_s=cfg.ledger.group_window_ms / 1000)

    def on_replica(up: bool, replica: str, model: str, at: float) -> None:
        if up:
            m = cfg.model(model)
            shape = cfg.shape(m.shape) if m else None
            ledger.replica_up(replica, model, shape.gpu_count if shape else 0, at)
        else:
            ledger.replica_down(replica, at)

    routes = RouteWatcher(cfg.models, pool_url, activator_id or f"activator-{uuid.uuid4().hex[:8]}",
                          token=token, on_replica=on_replica)
    tokens = TokenCounter(store_fetcher) if store_fetcher is not None else None
    service = CompletionService(cfg, Authenticator.from_config(cfg), routes, metrics, ledger, tokens)

    async def refresh_keys() -> None:
        # Keys added or revoked with `thaw tenants` take effect within a second.
        while True:
            try:
                active, revoked = await asyncio.to_thread(keys_snapshot, cfg.ledger_path)
                service.auth.update_dynamic(active, revoked)
            except Exception as exc:
                log.warning("key_refresh_failed", error=str(exc))
            await asyncio.sleep(1.0)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await routes.start()
        key_task = asyncio.create_task(refresh_keys())
        # What exists now (modules, the app, config) lives as long as the process: out of
        # the collector's sight, full collections stay short under load (tail latency).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            key_task.cancel()
            await routes.close()
            await service.close()
            ledger.close()

    app = FastAPI(title="thaw activator", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.cfg = cfg
    app.state.routes = routes
    app.state.service = service
    app.state.metrics = metrics
    app.state.ledger = ledger

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        rid = request_id_from(request)
        if exc.status_code == 404:
            err: ApiError = NotFound(f"no route {request.method} {request.url.path}")
            err.code = "not_found"
        elif exc.status_code == 405:
            return JSONResponse(error_body(405, f"method {request.method} not allowed on {request.url.path}",
                                           "invalid_request_error", None, "method_not_allowed"),
                                status_code=405, headers={"x-request-id": rid})
        else:
            err = BadRequest(str(exc.detail))
        return error_response(err, {"x-request-id": rid})

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(BadRequest(first.get("msg", "invalid request"), param=param),
                              {"x-request-id": request_id_from(request)})

    async def completion(request: Request, kind: Kind, path_model: str | None) -> Response:
        ctx = RequestContext(request_id=request_id_from(request), arrival=time.time())
        with bind_request(ctx.request_id, kind=kind):
            try:
                response = await service.handle(request, kind, ctx, path_model)
            except ApiError as exc:
                ctx.status = exc.status
                await service.record(ctx, exc.code)
                service.observe_end(ctx, exc)
                log.info("request_refused", status=exc.status, code=exc.code, message=exc.message,
                         model=ctx.model.name if ctx.model else None)
                return error_response(exc, ctx.response_headers())
            except Exception:
                log.exception("request_failed")
                ctx.status = 500
                try:
                    await service.record(ctx, "internal_error")
                except Exception:
                    log.exception("ledger_append_failed")
                service.observe_end(ctx, ApiError("internal"))
                return internal_error_response(ctx.request_id, ctx.response_headers())
            service.observe_end(ctx)
            log.info("request_dispatched", model=ctx.model.name if ctx.model else None, status=ctx.status,
                     cold_start=ctx.cold, queue_ms=round(ctx.queue_s * 1000))
            return response

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await completion(request, "chat", None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(request, "completions", None)

    @app.post("/m/{model}/v1/chat/completions")
    async def chat_for(model: str, request: Request) -> Response:
        return await completion(request, "chat", model)

    @app.post("/m/{model}/v1/completions")
    async def completions_for(model: str, request: Request) -> Response:
        return await completion(request, "completions", model)

    def model_entry(name: str) -> dict[str, Any]:
        m = cfg.model(name)
        assert m is not None
        st = routes.routes[m.name]
        return {
            "id": m.resolved_served_name, "object": "model", "created": 0, "owned_by": "thaw",
            "max_model_len": m.max_context_tokens,
            "thaw": {"state": routes.state_of(m.name), "replicas_ready": len(st.replicas),
                     "replicas_loading": st.loading, "queue_depth": len(st.waiters),
                     "error": st.error if routes.state_of(m.name) == "failed" else None},
        }

    async def list_models(request: Request, only: str | None) -> Response:
        rid = request_id_from(request)
        try:
            principal = service.principal(request)
            if only is not None:
                model = service.resolve_model(principal, only)
                return JSONResponse({"object": "list", "data": [model_entry(model.name)]},
                                    headers={"x-request-id": rid})
        except ApiError as exc:
            return error_response(exc, {"x-request-id": rid})
        data = [model_entry(m.name) for m in cfg.models if principal.may_use(m.name)]
        return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": rid})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await list_models(request, None)

    @app.get("/v1/models/{model:path}")
    async def model_by_id(model: str, request: Request) -> Response:
        rid = request_id_from(request)
        try:
            m = service.resolve_model(service.principal(request), model)
        except ApiError as exc:
            return error_response(exc, {"x-request-id": rid})
        return JSONResponse(model_entry(m.name), headers={"x-request-id": rid})

    @app.get("/m/{model}/v1/models")
    async def models_for(model: str, request: Request) -> Response:
        return await list_models(request, model)

    @app.get("/v1/usage")
    async def usage(request: Request, since: str | None = None, until: str | None = None) -> Response:
        """The caller's own usage records (never another tenant's) and their totals."""
        rid = request_id_from(request)
        try:
            principal = service.principal(request)
            lo, hi = parse_time(since, "since"), parse_time(until, "until")
        except ApiError as exc:
            return error_response(exc, {"x-request-id": rid})
        records = await asyncio.to_thread(query_usage, cfg.ledger_path, tenant=principal.tenant, since=lo, until=hi)
        return JSONResponse({"object": "list", "tenant": principal.tenant, "totals": usage_totals(records),
                             "data": records}, headers={"x-request-id": rid})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "pool_connected": routes.connected}

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        for m in cfg.models:
            st = routes.routes[m.name]
            metrics.replicas.labels(m.name, "ready").set(len(st.replicas))
            metrics.replicas.labels(m.name, "loading").set(st.loading)
            metrics.queue_depth.labels(m.name).set(len(st.waiters))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
