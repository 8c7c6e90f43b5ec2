"""API keys (``warm_pool.registry.admin.KeyAdmin``): tenants' keys, and the admin keys
that the model and tenant API also admits."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from thaw.wire import (
    AdminKeys,
    KeyTable,
    NewAdminKey,
    NewAdminKeyReply,
    NewKey,
    NewKeyReply,
    RevokeKey,
    RevokeReply,
)
from warm_pool.api.errors import refusal_doc
from warm_pool.api.parts import Actor, Parts, reply

router = APIRouter()


@router.get("/v1/keys/admin", response_model=AdminKeys)
async def admin_keys(parts: Parts) -> Response:
    return reply(await parts.key_admin.admin_keys())


@router.post("/v1/keys/admin", response_model=NewAdminKeyReply, status_code=201)
async def add_admin_key(body: NewAdminKey, parts: Parts, who: Actor) -> Response:
    # Under /v1/keys, not /v1/admin: an admin key cannot mint another.
    return reply(await parts.key_admin.add_admin(body.label, who), 201)


@router.post("/v1/keys/admin/revoke", response_model=RevokeReply, responses={404: refusal_doc("No such active key")})
async def revoke_admin_key(body: RevokeKey, parts: Parts, who: Actor) -> Response:
    return reply(await parts.key_admin.revoke_admin(body.key, who))


@router.get("/v1/keys", response_model=KeyTable)
async def keys(parts: Parts) -> Response:
    return reply(await parts.key_admin.table())


@router.post("/v1/keys", response_model=NewKeyReply, status_code=201,
             responses={404: refusal_doc("No such tenant in the config")})
async def add_key(body: NewKey, parts: Parts, who: Actor) -> Response:
    return reply(await parts.key_admin.add(body.tenant, body.label, who), 201)


@router.post("/v1/keys/revoke", response_model=RevokeReply, responses={404: refusal_doc("No such active key")})
async def revoke_key(body: RevokeKey, parts: Parts, who: Actor) -> Response:
    return reply(await parts.key_admin.revoke(body.key, who))
