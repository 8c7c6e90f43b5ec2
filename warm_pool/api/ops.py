"""The operators' liveness (``/healthz``) and where the leader is (``/v1/leader``), and
what a follower answers to everything else (``FollowTheLeader``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from thaw.controllers import LEADER_HEADER
from thaw.wire import ErrorReply, LeaderView
from warm_pool import console
from warm_pool.api.parts import Manager

if TYPE_CHECKING:
    from warm_pool.manager import PoolManager

router = APIRouter()

# What a follower answers itself: liveness, metrics, and where the leader is.
# What a follower answers itself: its health, its metrics, where the leader is, and the
# console's page (whose reads then say where the leader is).
FOLLOWER_PATHS = frozenset({"/healthz", "/metrics", "/v1/leader"}) | frozenset(console.ASSETS)


@router.get("/healthz")
async def healthz(manager: Manager) -> dict[str, object]:
    return {"ok": True, "epoch": manager.epoch, "adopted": manager.adopted,
            "role": "leader" if manager.leading else "follower", "leader": manager.leader_url,
            "routes_version": manager.feed.table.version, "catalog_version": manager.feed.table.catalog_version}


@router.get("/v1/leader", response_model=LeaderView)
async def leader(manager: Manager) -> LeaderView:
    leadership, parts = manager.parts.leadership, manager.parts
    lead = leadership.leader if leadership is not None else None
    return LeaderView(controller=parts.controller_id, url=parts.url, leading=manager.leading,
                      leader_url=parts.url if manager.leading else manager.leader_url,
                      term=lead.term if lead is not None else manager.term)


class FollowTheLeader:
    """ASGI middleware, the outermost: a follower decides nothing and holds nothing a
    caller needs, so it says where the leader is (thaw.controllers follows it), before
    any credential is checked (its own copy of the admin keys may be behind the
    leader's). Plain ASGI: every heartbeat and demand signal crosses it, and Starlette's
    ``BaseHTTPMiddleware`` cost a seventh of the controller's loop in a burst at fleet
    size."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager: PoolManager | None = scope["app"].state.manager if scope["type"] == "http" else None
        if manager is None or manager.leading or scope["path"] in FOLLOWER_PATHS:
            await self.app(scope, receive, send)
            return
        leader = manager.leader_url
        headers = {"Retry-After": "1", "X-Thaw-Role": "follower"}
        if leader:
            headers[LEADER_HEADER] = leader
        message = (f"this controller follows; the leader is at {leader}" if leader
                   else "this controller follows and no controller leads now (a takeover is under way); retry")
        await JSONResponse(ErrorReply(error=message, leader=leader).model_dump(exclude_none=True),
                           status_code=503, headers=headers)(scope, receive, send)
