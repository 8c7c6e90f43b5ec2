"""The activator's HTTP app: thin routes over ``CompletionService`` and ``RouteWatcher``.

``create_app`` builds the object graph once and keeps it on ``app.state``.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from activator.auth import Authenticator
from activator.batch.batches import CREATE_BODY, BatchesApi
from activator.batch.files import UPLOAD_BODY, FilesApi, file_object
from activator.batch.worker import BatchWorker
from activator.bounds import RequestBounds
from activator.catalog import CatalogCache, apply_catalog
from activator.conversations.conversations import (
    CONVERSATION_BODY,
    ITEMS_BODY,
    METADATA_BODY,
    ConversationsApi,
)
from activator.conversations.responses import CREATE_BODY as RESPONSES_BODY
from activator.conversations.responses import ResponsesApi
from activator.edge import CompletionEdge, IncomingRequest, RequestGuard, request_id_from
from activator.errors import (
    ApiError,
    BadRequest,
    NotFound,
    TooManyFailedAuth,
    Unauthorized,
    error_body,
    error_response,
    internal_error_response,
)
from activator.keys import KeyCache
from activator.keys import split as split_keys
from activator.ledger import Ledger, parse_time, usage_totals
from activator.limits import build_limiter
from activator.metrics import ActivatorMetrics
from activator.protocol import ERROR_RESPONSES, ErrorResponse, add_request_schemas, request_body
from activator.route_watcher import RouteWatcher, public_failure
from activator.service import CompletionService, Kind, RequestContext
from activator.shipping import UsageShipper
from activator.tokens import FileFetcher, TokenCounter
from activator.usage_store import UsageReader, read_usage
from thaw.config import ThawConfig
from thaw.controllers import ControllerClient
from thaw.http_api import allowed_methods
from thaw.log import bind_request, get_logger
from thaw.s3client import S3Client
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
    registry = CollectorRegistry()
    metrics = ActivatorMetrics(registry)
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

    async def on_catalog(catalog: Catalog) -> None:
        live = apply_catalog(service.cfg, catalog)
        service.cfg = live
        auth.update_catalog(live.tenants, live.models)
        routes.set_models(live.models)
        log.info("catalog_updated", version=catalog.version, models=len(catalog.models),
                 tenants=len(catalog.tenants))
        try:
            await asyncio.to_thread(catalog_cache.save, catalog)
        except OSError as exc:
            log.warning("catalog_cache_write_failed", path=str(catalog_cache.path), error=str(exc))

    routes = RouteWatcher(cfg.models, pool_url, activator_id, token=token, on_replica=on_replica,
                          ejection_s=cfg.server.replica_ejection_s,
                          on_keys=on_keys, keys_version=known_keys.version if known_keys else None,
                          on_catalog=on_catalog, catalog_version=known_catalog.version if known_catalog else None)
    tokens = TokenCounter(store_fetcher) if store_fetcher is not None else None
    # limits.backend redis: shared by every activator; while Redis is away, this one's
    # share is the limit over the activators the controller hears from.
    limiter = build_limiter(cfg.limits, metrics, owner=activator_id, activators=lambda: routes.activators,
                            processes=processes)
    service = CompletionService(cfg, auth, routes, metrics, ledger, tokens, limiter=limiter)
    bucket, prefix = cfg.object_store.bucket, cfg.ledger.ship_prefix
    shipper = (UsageShipper(ledger.path, activator_id, usage_client, bucket, prefix=prefix,
                            interval_s=cfg.ledger.ship_interval_s, max_records=cfg.ledger.ship_max_records,
                            metrics=metrics)
               if usage_client is not None and cfg.ledger.ship else None)
    usage_reader = UsageReader(usage_client, bucket, prefix) if usage_client is not None else None
    controller = ControllerClient(pool_url, token)  # the Files and Batches APIs' calls
    files = FilesApi(cfg.batch, bucket, files_client, controller)
    batches = BatchesApi(controller)
    responses = ResponsesApi(service, controller)
    conversations = ConversationsApi(controller)
    batch_worker = BatchWorker(service, routes, controller, activator_id, cfg.batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await routes.start()
        await limiter.start()
        await batch_worker.start()
        if shipper is not None:
            await shipper.start()
        prefetch = (asyncio.create_task(tokens.prefetch(cfg.engine_model(m).uri for m in cfg.models), name="tokenizer_prefetch")
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

    app = FastAPI(title="thaw activator", lifespan=lifespan, docs_url=None, redoc_url=None)
    # The completion routes read their bodies raw (size limit); /openapi.json still
    # documents them, from activator.protocol's models.
    fastapi_openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or add_request_schemas(fastapi_openapi())  # type: ignore[method-assign]
    app.state.cfg = cfg
    app.state.activator_id = activator_id
    app.state.routes = routes
    app.state.service = service
    app.state.limiter = limiter
    app.state.metrics = metrics
    app.state.ledger = ledger
    app.state.shipper = shipper
    app.state.usage_reader = usage_reader

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        rid = request_id_from(request)
        if exc.status_code == 404:
            err: ApiError = NotFound(f"no route {request.method} {request.url.path}")
            err.code = "not_found"
        elif exc.status_code == 405:
            return JSONResponse(error_body(405, f"method {request.method} not allowed on {request.url.path}",
                                           "invalid_request_error", None, "method_not_allowed"),
                                status_code=405, headers={"x-request-id": rid,
                                                          "Allow": allowed_methods(app.router.routes, request.scope)})
        else:
            err = BadRequest(str(exc.detail))
        return error_response(err, {"x-request-id": rid})

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        # E.g. the guard's 408 for a body too slow, raised while a route reads it.
        return error_response(exc, {"x-request-id": request_id_from(request)})

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(BadRequest(first.get("msg", "invalid request"), param=param),
                              {"x-request-id": request_id_from(request)})

    async def completion(request: IncomingRequest, kind: Kind, path_model: str | None) -> Response:
        return await dispatch(request, kind, lambda ctx: service.handle(request, kind, ctx, path_model))

    async def dispatch(request: IncomingRequest, kind: str,
                       call: Callable[[RequestContext], Awaitable[Response]]) -> Response:
        """A request served by the engines (a completion, a response): its errors in
        OpenAI's shape, each recorded once."""
        ctx = RequestContext(request_id=request_id_from(request), arrival=time.time())
        with bind_request(ctx.request_id, kind=kind):
            try:
                response = await call(ctx)
            except ApiError as exc:
                ctx.status = exc.status
                await service.record(ctx, exc.code)
                service.observe_end(ctx, exc)
                if not isinstance(exc, TooManyFailedAuth):  # logged once per address (activator.throttle)
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

    # The completion endpoints' traffic takes the short way (activator.edge); the routes
    # below document them in /openapi.json and serve them if the edge is not in front.
    app.add_middleware(CompletionEdge, handler=completion)
    # In front of both (added last: outermost of the two): header bounds, body deadline.
    app.add_middleware(RequestGuard, bounds=RequestBounds.from_server(cfg.server),
                       body_timeout_s=cfg.server.body_timeout_s,
                       slow_bodies={("POST", "/v1/files"): cfg.batch.upload_timeout_s})

    @app.post("/v1/chat/completions", openapi_extra=request_body("chat", model_in_path=False),
              responses=ERROR_RESPONSES)
    async def chat(request: Request) -> Response:
        return await completion(request, "chat", None)

    @app.post("/v1/completions", openapi_extra=request_body("completions", model_in_path=False),
              responses=ERROR_RESPONSES)
    async def completions(request: Request) -> Response:
        return await completion(request, "completions", None)

    @app.post("/m/{model}/v1/chat/completions", openapi_extra=request_body("chat", model_in_path=True),
              responses=ERROR_RESPONSES)
    async def chat_for(model: str, request: Request) -> Response:
        return await completion(request, "chat", model)

    @app.post("/m/{model}/v1/completions", openapi_extra=request_body("completions", model_in_path=True),
              responses=ERROR_RESPONSES)
    async def completions_for(model: str, request: Request) -> Response:
        return await completion(request, "completions", model)

    def model_entry(name: str) -> dict[str, Any]:
        m = service.cfg.model(name)
        assert m is not None
        st = routes.routes[m.name]
        return {
            "id": m.resolved_served_name, "object": "model", "created": 0, "owned_by": "thaw",
            "max_model_len": m.max_context_tokens,
            "thaw": {"state": routes.state_of(m.name), "replicas_ready": len(st.replicas),
                     "replicas_loading": st.loading, "queue_depth": len(st.waiters),
                     "error": public_failure(st.failure_kind) if routes.state_of(m.name) == "failed" else None},
        }

    # An ApiError raised by a route is answered by the handler above (OpenAI's shape,
    # the request id): routes raise, none maps errors itself.
    async def list_models(request: Request, only: str | None) -> Response:
        rid = request_id_from(request)
        principal = service.principal(request)
        if only is not None:
            model = service.resolve_model(principal, only)
            return JSONResponse({"object": "list", "data": [model_entry(model.name)]},
                                headers={"x-request-id": rid})
        data = [model_entry(m.name) for m in service.cfg.models if principal.may_use(m.name)]
        return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": rid})

    @app.get("/v1/models", responses=ERROR_RESPONSES)
    async def models(request: Request) -> Response:
        return await list_models(request, None)

    @app.get("/v1/models/{model:path}", responses=ERROR_RESPONSES)
    async def model_by_id(model: str, request: Request) -> Response:
        m = service.resolve_model(service.principal(request), model)
        return JSONResponse(model_entry(m.name), headers={"x-request-id": request_id_from(request)})

    @app.get("/m/{model}/v1/models", responses=ERROR_RESPONSES)
    async def models_for(model: str, request: Request) -> Response:
        return await list_models(request, model)

    @app.get("/v1/usage", responses=ERROR_RESPONSES)
    async def usage(request: Request, since: str | None = None, until: str | None = None) -> Response:
        """The caller's own usage records (never another tenant's) and their totals, from
        every activator's shipped segments and this one's ledger, with the shipping lag."""
        rid = request_id_from(request)
        principal = service.principal(request)
        lo, hi = parse_time(since, "since"), parse_time(until, "until")
        fleet = await asyncio.to_thread(read_usage, usage_reader, {activator_id: ledger.path},
                                        tenant=principal.tenant, since=lo, until=hi)
        reason = fleet.reason
        if not fleet.complete and usage_reader is not None:
            # The store's error names its endpoint: for the log, not for API callers.
            log.warning("usage_store_unreadable", error=fleet.reason)
            reason = "the usage other activators shipped could not be read: this activator's records only"
        # Which activator (a host name) holds which record is the operators' business.
        data = [{k: v for k, v in r.items() if k not in ("activator", "id")} for r in fleet.records]
        return JSONResponse({"object": "list", "tenant": principal.tenant, "totals": usage_totals(fleet.records),
                             "data": data, "shipping": {"lag_s": fleet.shipping()["lag_s"]},
                             "complete": fleet.complete, "incomplete_reason": reason}, headers={"x-request-id": rid})

    # -- the Files API (activator.batch.files) ------------------------------------------------

    async def tenant_call(request: Request, call: Any, kind: str = "files") -> Response:
        rid = request_id_from(request)
        with bind_request(rid, kind=kind):
            try:
                principal = service.principal(request)
                out = await call(principal.tenant)
            except ApiError as exc:
                return error_response(exc, {"x-request-id": rid})
            except Exception:
                log.exception("files_request_failed")
                return internal_error_response(rid, {"x-request-id": rid})
        if isinstance(out, Response):
            out.headers["x-request-id"] = rid
            return out
        return JSONResponse(out, headers={"x-request-id": rid})

    @app.post("/v1/files", responses=ERROR_RESPONSES, openapi_extra=UPLOAD_BODY)
    async def upload_file(request: Request) -> Response:
        return await tenant_call(request, lambda tenant: files.upload(tenant, request))

    @app.get("/v1/files", responses=ERROR_RESPONSES)
    async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                         limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                         order: Literal["asc", "desc"] = "desc") -> Response:
        return await tenant_call(request, lambda tenant: files.list(tenant, purpose=purpose, after=after,
                                                                     limit=limit, order=order))

    @app.get("/v1/files/{file_id}", responses=ERROR_RESPONSES)
    async def get_file(file_id: str, request: Request) -> Response:
        async def call(tenant: str) -> dict[str, Any]:
            return file_object(await files.record(tenant, file_id))

        return await tenant_call(request, call)

    @app.get("/v1/files/{file_id}/content", responses=ERROR_RESPONSES)
    async def file_content(file_id: str, request: Request) -> Response:
        async def call(tenant: str) -> Response:
            record, chunks = await files.content(tenant, file_id)
            return StreamingResponse(chunks, media_type="application/octet-stream", headers={
                "content-length": str(record.bytes),
                "content-disposition": f'attachment; filename="{quote(record.filename)}"'})

        return await tenant_call(request, call)

    @app.delete("/v1/files/{file_id}", responses=ERROR_RESPONSES)
    async def delete_file(file_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: files.delete(tenant, file_id))

    # -- the Batches API (activator.batch.batches; lines run by activator.batch.worker) --------

    @app.post("/v1/batches", responses=ERROR_RESPONSES, openapi_extra=CREATE_BODY)
    async def create_batch(request: Request) -> Response:
        async def call(tenant: str) -> dict[str, Any]:
            try:
                body = json.loads(await request.body())
            except ValueError:
                raise BadRequest("the body is not JSON") from None
            return await batches.create(tenant, body)

        return await tenant_call(request, call)

    @app.get("/v1/batches", responses=ERROR_RESPONSES)
    async def list_batches(request: Request, after: str | None = None,
                           limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
        return await tenant_call(request, lambda tenant: batches.list(tenant, after=after, limit=limit))

    @app.get("/v1/batches/{batch_id}", responses=ERROR_RESPONSES)
    async def get_batch(batch_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: batches.get(tenant, batch_id))

    @app.post("/v1/batches/{batch_id}/cancel", responses=ERROR_RESPONSES)
    async def cancel_batch(batch_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: batches.cancel(tenant, batch_id))

    # -- the Responses API (activator.conversations.responses) -----------------------------------------

    @app.post("/v1/responses", responses=ERROR_RESPONSES, openapi_extra=RESPONSES_BODY)
    async def create_response(request: Request) -> Response:
        return await dispatch(request, "responses", lambda ctx: responses.create(request, ctx))

    @app.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def get_response(response_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: responses.get(tenant, response_id), "responses")

    @app.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
    async def delete_response(response_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: responses.delete(tenant, response_id), "responses")

    @app.get("/v1/responses/{response_id}/input_items", responses=ERROR_RESPONSES)
    async def response_input_items(response_id: str, request: Request, after: str | None = None,
                                   limit: Annotated[int, Query(ge=1, le=100)] = 20,
                                   order: Literal["asc", "desc"] = "desc") -> Response:
        return await tenant_call(request, lambda tenant: responses.input_items(
            tenant, response_id, after=after, limit=limit, order=order), "responses")

    # -- the Conversations API (activator.conversations.conversations) ---------------------------------

    async def json_body(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except ValueError:
            raise BadRequest("the body is not JSON") from None

    @app.post("/v1/conversations", responses=ERROR_RESPONSES, openapi_extra=CONVERSATION_BODY)
    async def create_conversation(request: Request) -> Response:
        async def call(tenant: str) -> dict[str, Any]:
            return await conversations.create(tenant, await json_body(request))

        return await tenant_call(request, call, "conversations")

    @app.get("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES)
    async def get_conversation(conversation_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: conversations.get(tenant, conversation_id), "conversations")

    @app.post("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES, openapi_extra=METADATA_BODY)
    async def update_conversation(conversation_id: str, request: Request) -> Response:
        async def call(tenant: str) -> dict[str, Any]:
            return await conversations.update(tenant, conversation_id, await json_body(request))

        return await tenant_call(request, call, "conversations")

    @app.delete("/v1/conversations/{conversation_id}", responses=ERROR_RESPONSES)
    async def delete_conversation(conversation_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: conversations.delete(tenant, conversation_id),
                                 "conversations")

    @app.get("/v1/conversations/{conversation_id}/items", responses=ERROR_RESPONSES)
    async def conversation_items(conversation_id: str, request: Request, after: str | None = None,
                                 limit: Annotated[int, Query(ge=1, le=100)] = 20,
                                 order: Literal["asc", "desc"] = "desc") -> Response:
        return await tenant_call(request, lambda tenant: conversations.list_items(
            tenant, conversation_id, after=after, limit=limit, order=order), "conversations")

    @app.post("/v1/conversations/{conversation_id}/items", responses=ERROR_RESPONSES, openapi_extra=ITEMS_BODY)
    async def add_conversation_items(conversation_id: str, request: Request) -> Response:
        async def call(tenant: str) -> dict[str, Any]:
            return await conversations.add_items(tenant, conversation_id, await json_body(request))

        return await tenant_call(request, call, "conversations")

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERROR_RESPONSES)
    async def get_conversation_item(conversation_id: str, item_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: conversations.get_item(tenant, conversation_id, item_id),
                                 "conversations")

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERROR_RESPONSES)
    async def delete_conversation_item(conversation_id: str, item_id: str, request: Request) -> Response:
        return await tenant_call(request, lambda tenant: conversations.delete_item(tenant, conversation_id, item_id),
                                 "conversations")

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "pool_connected": routes.connected}

    # The metrics name every model: on the tenants' port they are the operators' and
    # need the cluster token (Prometheus: `authorization: {credentials: <token>}`), or a
    # tenant would learn which models other tenants have. Without a token (a bare
    # create_app in tests and tools) they are open.
    expected = f"Bearer {token}".encode() if token else None

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={401: {"model": ErrorResponse, "description": "No cluster token, or the wrong one"}})
    async def metrics_endpoint(request: Request) -> Response:
        if expected is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), expected):
            raise Unauthorized("/metrics needs the cluster token (Authorization: Bearer <token>)",
                               code="cluster_token_required", headers={"WWW-Authenticate": "Bearer"})
        for m in service.cfg.models:
            st = routes.routes[m.name]
            metrics.replicas.labels(m.name, "ready").set(len(st.replicas))
            metrics.replicas.labels(m.name, "loading").set(st.loading)
            metrics.queue_depth.labels(m.name).set(len(st.waiters))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
