"""The controller's HTTP API: workers heartbeat, activators report traffic and long-poll
routes, operators read the pool's status and events.

Routers hold no logic: each endpoint hands over to ``PoolManager``. Every endpoint but
``/healthz`` needs the cluster token (``thaw.auth.ClusterAuth``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from thaw.auth import ClusterAuth, document_cluster_auth
from thaw.controllers import LEADER_HEADER
from thaw.http_api import refuse_in_api_shape
from thaw.wire import (
    ActivityReport,
    AdminKeys,
    ApplyReply,
    ApplyRequest,
    BudgetChange,
    BudgetView,
    Catalog,
    ClockStep,
    ClockView,
    ColdStartRecord,
    DemandSignal,
    ErrorReply,
    HeartbeatReply,
    KeyTable,
    LeaderView,
    ModelDeploy,
    ModelRecord,
    ModelRecords,
    ModelRollback,
    ModelUpdate,
    NewAdminKey,
    NewAdminKeyReply,
    NewKey,
    NewKeyReply,
    PoolEvents,
    PoolStatus,
    RevokeKey,
    RevokeReply,
    RouteTable,
    TenantChange,
    TenantCreate,
    TenantRecord,
    TenantRecords,
    WorkerStatus,
)
from warm_pool.api_errors import NotFound, refusal_doc
from warm_pool.api_errors import install as install_refusals
from warm_pool.batch.api import batch_router
from warm_pool.batch.files_api import files_router
from warm_pool.conversations.api import responses_router
from warm_pool.manager import PoolManager
from warm_pool.persist import BudgetRefused
from warm_pool.policy.decide import ModelActivity


def create_pool_app(manager: PoolManager, token: str | None, *, manage_lifecycle: bool = True) -> FastAPI:
    """The controller's app. ``token`` None (in-process tests only) checks no token."""

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
                  responses={400: refusal("The body could not be read (not UTF-8)"),
                             422: refusal("Malformed request: each field's problem"),
                             503: refusal("This controller follows another (see X-Thaw-Leader and leader), "
                                          "or the state database is away")})
    app.state.manager = manager

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or '(body)'}: {e.get('msg')}"
                    for e in exc.errors()]
        return JSONResponse({"error": "invalid request: " + "; ".join(problems)}, status_code=422)

    refuse_in_api_shape(app)

    # Refusals raised by the routes: one table (warm_pool.api_errors).
    install_refusals(app)

    async def follow_the_leader(request: Request, call_next: Any) -> Response:
        # A follower decides nothing and holds nothing a caller needs: it says where the
        # leader is (thaw.controllers follows it), before any credential is checked (its
        # own copy of the admin keys may be behind the leader's).
        if manager.leading or request.url.path in FOLLOWER_PATHS:
            return await call_next(request)  # type: ignore[no-any-return]
        leader = manager.leader_url
        headers = {"Retry-After": "1", "X-Thaw-Role": "follower"}
        if leader:
            headers[LEADER_HEADER] = leader
        message = (f"this controller follows; the leader is at {leader}" if leader
                   else "this controller follows and no controller leads now (a takeover is under way); retry")
        return JSONResponse(ErrorReply(error=message, leader=leader).model_dump(exclude_none=True),
                            status_code=503, headers=headers)

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"ok": True, "epoch": manager.epoch, "adopted": manager.adopted,
                "role": "leader" if manager.leading else "follower", "leader": manager.leader_url}

    @app.get("/v1/leader", response_model=LeaderView)
    async def leader() -> LeaderView:
        lead = manager.leadership.leader if manager.leadership is not None else None
        return LeaderView(controller=manager.controller_id, url=manager.url, leading=manager.leading,
                          leader_url=manager.url if manager.leading else manager.leader_url,
                          term=lead.term if lead is not None else manager.term)

    @app.post("/v1/workers/heartbeat", response_model=HeartbeatReply,
              responses={403: refusal("An instance this controller did not launch, or one it is terminating")})
    async def heartbeat(body: WorkerStatus) -> Response:
        return JSONResponse(manager.heartbeat(body).model_dump(mode="json"))

    @app.post("/v1/reports", status_code=204)
    async def report(body: ActivityReport) -> Response:
        manager.report(
            body.activator_id,
            {name: ModelActivity(r.queued, r.in_flight, r.last_request_at) for name, r in body.models.items()},
            arrivals={name: r.arrivals for name, r in body.models.items()},
            ttfts={name: r.ttft_s for name, r in body.models.items() if r.ttft_s},
        )
        return Response(status_code=204)

    @app.post("/v1/demand", status_code=202, responses={404: refusal("No such model in the config")})
    async def demand(body: DemandSignal) -> JSONResponse:
        model = manager.cfg.model(body.model)
        if model is None:
            raise NotFound(f"unknown model {body.model!r}")
        manager.demand(model.name)
        return JSONResponse({"accepted": True}, status_code=202)

    @app.post("/v1/cold_starts", status_code=204)
    async def cold_start(body: ColdStartRecord) -> Response:
        manager.record_cold_start(body)
        return Response(status_code=204)

    @app.get("/v1/routes", response_model=RouteTable,
             responses={503: refusal("The controller is still adopting the fleet (see Retry-After)")})
    async def routes(since: int = Query(-1), epoch: str | None = Query(None),
                     wait_s: float = Query(0.0, ge=0.0, le=60.0)) -> Response:
        # Long poll: answer as soon as the table's version passes `since` (at once for a
        # watcher that knew another epoch), or after wait_s.
        table = await manager.wait_routes(since, epoch, wait_s)
        if table is None:
            return JSONResponse({"error": "the controller is adopting the fleet after its start; retry shortly"},
                                status_code=503, headers={"Retry-After": "1"})
        return Response(table.model_dump_json(), media_type="application/json")

    @app.get("/v1/state", response_model=PoolStatus)
    async def state() -> Response:
        return Response(manager.status().model_dump_json(), media_type="application/json")

    @app.get("/v1/events", response_model=PoolEvents)
    async def events(since: float = Query(0.0), history: bool = Query(False)) -> Response:
        # history: the decision log in the state database, every leader's (each event
        # names its controller and term); else this controller's recent events.
        found = await manager.event_history(since) if history else [e for e in manager.events if e.at >= since]
        return Response(PoolEvents(events=found).model_dump_json(), media_type="application/json")

    @app.get("/v1/pool/budget", response_model=BudgetView)
    async def budget() -> Response:
        return Response(manager.budget_view().model_dump_json(), media_type="application/json")

    @app.put("/v1/pool/budget", response_model=BudgetView,
             responses={404: refusal("No pool of that shape")})
    async def set_budget(body: BudgetChange, request: Request) -> Response:
        try:
            view = await manager.change_budget(body, actor(request))
        except BudgetRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        return Response(view.model_dump_json(), media_type="application/json")

    # The controller's clock (warm_pool.clock): stepped, when controller.stepped_clock.
    @app.get("/v1/pool/clock", response_model=ClockView)
    async def clock() -> Response:
        return Response(manager.clock_admin.view().model_dump_json(), media_type="application/json")

    @app.post("/v1/pool/clock", response_model=ClockView,
              responses={409: refusal("This controller keeps the wall clock (controller.stepped_clock is false)"),
                         422: refusal("A step the workers' heartbeats would read as silence")})
    async def step_clock(body: ClockStep, request: Request) -> Response:
        return Response(manager.clock_admin.advance(body, actor(request)).model_dump_json(),
                        media_type="application/json")

    def actor(request: Request) -> str:
        # Who asked: the operator's name as the CLI sends it, the admin key it used (if
        # not the cluster token), and the address it came from.
        client = request.client.host if request.client else "?"
        admin = manager.key_admin.admin(request.headers.get("authorization", "").encode())
        via = f" with admin key {admin.prefix}…{' (' + admin.label + ')' if admin.label else ''}" if admin else ""
        return f"{request.headers.get('x-thaw-actor') or 'unknown'}{via} ({client})"

    @app.get("/v1/keys/admin", response_model=AdminKeys)
    async def admin_keys() -> Response:
        return reply(await manager.key_admin.admin_keys())

    @app.post("/v1/keys/admin", response_model=NewAdminKeyReply, status_code=201)
    async def add_admin_key(body: NewAdminKey, request: Request) -> Response:
        # Under /v1/keys, not /v1/admin: an admin key cannot mint another.
        return reply(await manager.key_admin.add_admin(body.label, actor(request)), 201)

    @app.post("/v1/keys/admin/revoke", response_model=RevokeReply, responses={404: refusal("No such active key")})
    async def revoke_admin_key(body: RevokeKey, request: Request) -> Response:
        return reply(await manager.key_admin.revoke_admin(body.key, actor(request)))

    @app.get("/v1/keys", response_model=KeyTable)
    async def keys() -> Response:
        return Response((await manager.key_table()).model_dump_json(), media_type="application/json")

    @app.post("/v1/keys", response_model=NewKeyReply, status_code=201,
              responses={404: refusal("No such tenant in the config")})
    async def add_key(body: NewKey, request: Request) -> Response:
        reply = await manager.add_key(body.tenant, body.label, actor(request))
        return Response(reply.model_dump_json(), status_code=201, media_type="application/json")

    @app.post("/v1/keys/revoke", response_model=RevokeReply, responses={404: refusal("No such active key")})
    async def revoke_key(body: RevokeKey, request: Request) -> Response:
        reply = await manager.revoke_key(body.key, actor(request))
        return Response(reply.model_dump_json(), media_type="application/json")

    # -- the model registry (warm_pool.registry.models) -------------------------------------
    registry = manager.model_admin
    checked: dict[int | str, dict[str, Any]] = {422: refusal("A setting the config does not admit, weights that are not complete in the "
                            "store, or a model that does not fit its shape (the message names the field)"),
               503: refusal("The controller cannot read the store to check the weights")}

    def reply(body: BaseModel, status: int = 200) -> Response:
        return Response(body.model_dump_json(), status_code=status, media_type="application/json")

    @app.get("/v1/admin/models", response_model=ModelRecords)
    async def list_models() -> Response:
        return Response(registry.list().model_dump_json(), media_type="application/json")

    @app.post("/v1/admin/models", response_model=ModelRecord, status_code=201,
              responses={409: refusal("The name is in use"), **checked})
    async def deploy_model(body: ModelDeploy, request: Request) -> Response:
        return reply(await registry.deploy(body, actor(request)), 201)

    @app.get("/v1/admin/models/{name}", response_model=ModelRecord,
             responses={404: refusal("No model of that name was ever deployed")})
    async def describe_model(name: str) -> Response:
        return reply(registry.describe(name))

    @app.patch("/v1/admin/models/{name}", response_model=ModelRecord,
               responses={404: refusal("No such model is deployed"),
                          409: refusal("The change was based on a revision that is no longer current"), **checked})
    async def update_model(name: str, body: ModelUpdate, request: Request) -> Response:
        return reply(await registry.update(name, body, actor(request)))

    @app.post("/v1/admin/models/{name}/rollback", response_model=ModelRecord,
              responses={404: refusal("No such model is deployed, or no such revision"),
                         409: refusal("The change was based on a revision that is no longer current"), **checked})
    async def rollback_model(name: str, body: ModelRollback, request: Request) -> Response:
        return reply(await registry.rollback(name, body, actor(request)))

    @app.delete("/v1/admin/models/{name}", response_model=ModelRecord,
                responses={404: refusal("No such model is deployed"),
                           409: refusal("Adapters use it, or the revision given is no longer current")})
    async def remove_model(name: str, request: Request,
                           revision: int | None = Query(None, ge=1, description="the revision being removed "
                                                        "(refused if no longer current)")) -> Response:
        return reply(await registry.remove(name, actor(request), revision))

    # -- tenants (warm_pool.registry.tenants) ----------------------------------------------------
    tenants = manager.tenant_admin

    @app.get("/v1/admin/tenants", response_model=TenantRecords)
    async def list_tenants() -> Response:
        return reply(await tenants.list())

    @app.post("/v1/admin/tenants", response_model=TenantRecord, status_code=201,
              responses={409: refusal("A tenant of that name exists"),
                         422: refusal("allowed_models names models that are not deployed")})
    async def create_tenant(body: TenantCreate, request: Request) -> Response:
        return reply(await tenants.create(body, actor(request)), 201)

    @app.patch("/v1/admin/tenants/{name}", response_model=TenantRecord,
               responses={404: refusal("No such tenant"),
                          422: refusal("Nothing to change, or allowed_models names models that are not deployed")})
    async def change_tenant(name: str, body: TenantChange, request: Request) -> Response:
        return reply(await tenants.change(name, body, actor(request)))

    @app.delete("/v1/admin/tenants/{name}", response_model=TenantRecord,
                responses={404: refusal("No such tenant"), 409: refusal("The tenant owns models")})
    async def remove_tenant(name: str, request: Request) -> Response:
        return reply(await tenants.remove(name, actor(request)))

    @app.post("/v1/admin/apply", response_model=ApplyReply,
              responses={409: refusal("The registry changed while the plan was checked"), **checked})
    async def apply(body: ApplyRequest, request: Request) -> Response:
        return reply(await manager.applier.apply(body, actor(request)))

    @app.get("/v1/catalog", response_model=Catalog)
    async def catalog() -> Response:
        return Response(manager.catalog().model_dump_json(), media_type="application/json")

    app.include_router(files_router(manager.files, manager.clock))
    app.include_router(batch_router(manager.batches, manager.files, manager.batch_runner, manager.clock))
    app.include_router(responses_router(manager.responses, manager.clock))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(manager.registry), media_type=CONTENT_TYPE_LATEST)

    def admin_key(path: str, authorization: bytes) -> bool:
        # The model and tenant API also admits an admin key (`thaw admin-keys add`).
        return path.startswith("/v1/admin/") and manager.key_admin.admin(authorization) is not None

    if token is not None:
        app.add_middleware(ClusterAuth, token=token, also=admin_key)
        fastapi_openapi = app.openapi
        app.openapi = lambda: app.openapi_schema or document_cluster_auth(fastapi_openapi())  # type: ignore[method-assign]
    app.middleware("http")(follow_the_leader)  # the outermost: added last
    return app


# What a follower answers itself: liveness, metrics, and where the leader is.
FOLLOWER_PATHS = frozenset({"/healthz", "/metrics", "/v1/leader"})


refusal = refusal_doc  # an error answer in /openapi.json
