"""The controller's HTTP app: workers heartbeat, activators report traffic and long-poll
routes, operators read the pool's status and events and change what it serves.

``create_pool_app`` mounts the routers of ``warm_pool.api`` over the manager and its
parts (``warm_pool.assembly``), which the routes take by dependency. Every endpoint but
``/healthz`` needs the cluster token (``thaw.auth.ClusterAuth``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from thaw.auth import OPEN_PATHS, ClusterAuth, document_cluster_auth
from thaw.http_api import refuse_in_api_shape
from warm_pool import console
from warm_pool.api import activators, keys, metrics, ops, pool, registry, workers
from warm_pool.api.errors import install as install_refusals
from warm_pool.api.errors import refusal_doc
from warm_pool.batch.api import batch_router
from warm_pool.batch.files_api import files_router
from warm_pool.conversations.api import responses_router
from warm_pool.manager import PoolManager


def create_pool_app(manager: PoolManager, token: str | None, *, manage_lifecycle: bool = True) -> FastAPI:
    """The controller's app over ``manager`` (``warm_pool.assembly.build_pool``). ``token``
    None (in-process tests only) checks no token."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await manager.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await manager.close()

    # Every refusal is an ErrorReply, a malformed request's (422) too.
    app = FastAPI(title="thaw controller", lifespan=lifespan,
                  responses={400: refusal_doc("The body could not be read (not UTF-8)"),
                             422: refusal_doc("Malformed request: each field's problem"),
                             503: refusal_doc("This controller follows another (see X-Thaw-Leader and leader), "
                                              "or the state database is away")})
    app.state.manager = manager
    app.add_exception_handler(RequestValidationError, invalid)
    refuse_in_api_shape(app)
    # Refusals raised by the routes: one table (warm_pool.api.errors).
    install_refusals(app)

    parts = manager.parts
    # In this order, the order of /openapi.json's paths.
    for api in (ops, workers, activators, pool, keys, registry):
        app.include_router(api.router)
    app.include_router(files_router(parts.files, parts.clock))
    app.include_router(batch_router(parts.batches, parts.files, parts.batch_runner, parts.clock))
    app.include_router(responses_router(parts.responses, parts.clock))
    app.include_router(metrics.router)

    app.include_router(console.router)

    def admin_key(path: str, authorization: bytes) -> bool:
        # The model and tenant API also admits an admin key (`thaw admin-keys add`), and
        # so do the reads the console makes.
        return ((path.startswith("/v1/admin/") or path in console.READS)
                and parts.key_admin.admin(authorization) is not None)

    if token is not None:
        app.add_middleware(ClusterAuth, token=token, also=admin_key, open_paths=OPEN_PATHS | frozenset(console.ASSETS))
        fastapi_openapi = app.openapi
        app.openapi = lambda: app.openapi_schema or document_cluster_auth(fastapi_openapi())  # type: ignore[method-assign]
    app.add_middleware(ops.FollowTheLeader)  # the outermost: added last
    return app


async def invalid(_: Request, exc: Exception) -> JSONResponse:
    """A malformed request (422), in the ErrorReply shape: each field's problem."""
    assert isinstance(exc, RequestValidationError)
    problems = [f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or '(body)'}: {e.get('msg')}"
                for e in exc.errors()]
    return JSONResponse({"error": "invalid request: " + "; ".join(problems)}, status_code=422)
