"""The model and tenant registry (``warm_pool.registry``): models and their revisions,
tenants, a whole file of both at once (``/v1/admin/apply``), and the catalog of both
that activators serve."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from thaw.wire import (
    ApplyReply,
    ApplyRequest,
    Catalog,
    ModelDeploy,
    ModelRecord,
    ModelRecords,
    ModelRollback,
    ModelUpdate,
    TenantChange,
    TenantCreate,
    TenantRecord,
    TenantRecords,
)
from warm_pool.api.errors import refusal_doc
from warm_pool.api.parts import Actor, Parts, reply

router = APIRouter()

CHECKED: dict[int | str, dict[str, Any]] = {
    422: refusal_doc("A setting the config does not admit, weights that are not complete in the store, or a "
                     "model that does not fit its shape (the message names the field)"),
    503: refusal_doc("The controller cannot read the store to check the weights")}
STALE = refusal_doc("The change was based on a revision that is no longer current")


# -- models (warm_pool.registry.models) -------------------------------------------------
@router.get("/v1/admin/models", response_model=ModelRecords)
async def list_models(parts: Parts) -> Response:
    return reply(parts.model_admin.list())


@router.post("/v1/admin/models", response_model=ModelRecord, status_code=201,
             responses={409: refusal_doc("The name is in use"), **CHECKED})
async def deploy_model(body: ModelDeploy, parts: Parts, who: Actor) -> Response:
    return reply(await parts.model_admin.deploy(body, who), 201)


@router.get("/v1/admin/models/{name}", response_model=ModelRecord,
            responses={404: refusal_doc("No model of that name was ever deployed")})
async def describe_model(name: str, parts: Parts) -> Response:
    return reply(parts.model_admin.describe(name))


@router.patch("/v1/admin/models/{name}", response_model=ModelRecord,
              responses={404: refusal_doc("No such model is deployed"), 409: STALE, **CHECKED})
async def update_model(name: str, body: ModelUpdate, parts: Parts, who: Actor) -> Response:
    return reply(await parts.model_admin.update(name, body, who))


@router.post("/v1/admin/models/{name}/rollback", response_model=ModelRecord,
             responses={404: refusal_doc("No such model is deployed, or no such revision"), 409: STALE, **CHECKED})
async def rollback_model(name: str, body: ModelRollback, parts: Parts, who: Actor) -> Response:
    return reply(await parts.model_admin.rollback(name, body, who))


@router.delete("/v1/admin/models/{name}", response_model=ModelRecord,
               responses={404: refusal_doc("No such model is deployed"),
                          409: refusal_doc("Adapters use it, or the revision given is no longer current")})
async def remove_model(name: str, parts: Parts, who: Actor,
                       revision: int | None = Query(None, ge=1, description="the revision being removed "
                                                    "(refused if no longer current)")) -> Response:
    return reply(await parts.model_admin.remove(name, who, revision))


# -- tenants (warm_pool.registry.tenants) -----------------------------------------------
@router.get("/v1/admin/tenants", response_model=TenantRecords)
async def list_tenants(parts: Parts) -> Response:
    return reply(await parts.tenant_admin.list())


@router.post("/v1/admin/tenants", response_model=TenantRecord, status_code=201,
             responses={409: refusal_doc("A tenant of that name exists"),
                        422: refusal_doc("allowed_models names models that are not deployed")})
async def create_tenant(body: TenantCreate, parts: Parts, who: Actor) -> Response:
    return reply(await parts.tenant_admin.create(body, who), 201)


@router.patch("/v1/admin/tenants/{name}", response_model=TenantRecord,
              responses={404: refusal_doc("No such tenant"),
                         422: refusal_doc("Nothing to change, or allowed_models names models that are not deployed")})
async def change_tenant(name: str, body: TenantChange, parts: Parts, who: Actor) -> Response:
    return reply(await parts.tenant_admin.change(name, body, who))


@router.delete("/v1/admin/tenants/{name}", response_model=TenantRecord,
               responses={404: refusal_doc("No such tenant"), 409: refusal_doc("The tenant owns models")})
async def remove_tenant(name: str, parts: Parts, who: Actor) -> Response:
    return reply(await parts.tenant_admin.remove(name, who))


# -- both at once (warm_pool.registry.apply), and what activators serve ----------------------
@router.post("/v1/admin/apply", response_model=ApplyReply,
             responses={409: refusal_doc("The registry changed while the plan was checked"), **CHECKED})
async def apply(body: ApplyRequest, parts: Parts, who: Actor) -> Response:
    return reply(await parts.applier.apply(body, who))


@router.get("/v1/catalog", response_model=Catalog)
async def catalog(parts: Parts, since: int = Query(-1, description="the version the watcher holds"),
                  delta: bool = Query(False, description="the watcher merges deltas: only the models changed "
                                      "since `since`, when the controller still has those changes")) -> Response:
    return Response(parts.model_admin.catalogs.body(since, delta=delta), media_type="application/json")
