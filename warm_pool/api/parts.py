"""What the controller's routes take by dependency: its parts (``warm_pool.assembly``) and
the manager whose loop holds the fleet's current term (``app.state``), who asked, and
how a route answers with a wire model."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from warm_pool.assembly import PoolParts
from warm_pool.manager import PoolManager


def manager_of(request: Request) -> PoolManager:
    manager: PoolManager = request.app.state.manager
    return manager


def parts_of(request: Request) -> PoolParts:
    parts: PoolParts = request.app.state.manager.parts
    return parts


Manager = Annotated[PoolManager, Depends(manager_of)]
Parts = Annotated[PoolParts, Depends(parts_of)]


def actor_of(request: Request, parts: Parts) -> str:
    """Who asked: the operator's name as the CLI sends it, the admin key it used (if not
    the cluster token), and the address it came from."""
    client = request.client.host if request.client else "?"
    admin = parts.key_admin.admin(request.headers.get("authorization", "").encode())
    via = f" with admin key {admin.prefix}…{' (' + admin.label + ')' if admin.label else ''}" if admin else ""
    return f"{request.headers.get('x-thaw-actor') or 'unknown'}{via} ({client})"


Actor = Annotated[str, Depends(actor_of)]


def reply(body: BaseModel, status: int = 200) -> Response:
    return Response(body.model_dump_json(), status_code=status, media_type="application/json")
