"""How the controller's API answers a refusal: one table from exception type to status,
installed on the app once (``install``), so a route raises and never builds an error
response itself. Every refusal has the wire's ``ErrorReply`` shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from thaw.controllers import LEADER_HEADER
from thaw.wire import ErrorReply
from warm_pool.batch.files import FileExists
from warm_pool.conversations.store import ChainTooLong, ConversationFull, Exists
from warm_pool.db import StateUnavailable
from warm_pool.fencing import Deposed
from warm_pool.fleet.facts import UnknownInstance
from warm_pool.registry.admin import UnknownKey, UnknownTenant
from warm_pool.registry.models import RegistryRefused


class NotFound(LookupError):
    """What was asked for is not there (for this tenant): 404."""


class Conflict(Exception):
    """The change would contradict what is kept: 409."""


class BadRequest(ValueError):
    """A request that names something it may not (another purpose's file, ...): 400."""


class Unprocessable(ValueError):
    """A body whose fields contradict each other: 422."""


# Exception type -> status. The first entry a raised exception is an instance of wins.
REFUSALS: dict[type[Exception], int] = {
    BadRequest: 400, Unprocessable: 422,
    NotFound: 404, UnknownKey: 404, UnknownTenant: 404,
    Conflict: 409, FileExists: 409, Exists: 409, ConversationFull: 409, ChainTooLong: 409,
    UnknownInstance: 403,  # an instance this controller did not launch, or one it terminates
    StateUnavailable: 503,  # PostgreSQL is away: nothing was changed; retry
}
RETRY_AFTER_S = {503: 2}


def error_reply(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorReply(error=message).model_dump(exclude_none=True), status_code=status, headers=headers)


def status_of(exc: BaseException) -> int | None:
    if isinstance(exc, RegistryRefused):
        return exc.status  # a change of models or tenants checked and refused: its own status
    return next((status for kind, status in REFUSALS.items() if isinstance(exc, kind)), None)


def install(app: FastAPI) -> None:
    async def refused(_: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)
        assert status is not None
        after = RETRY_AFTER_S.get(status)
        if isinstance(exc, Deposed):
            # Its term ended under the call (warm_pool.fencing): nothing was changed, and it
            # answers as a follower does, so the client retries at the leader.
            headers = {"Retry-After": "1", "X-Thaw-Role": "follower"}
            if exc.leader_url:
                headers[LEADER_HEADER] = exc.leader_url
            return JSONResponse(ErrorReply(error=f"this controller no longer leads: {exc}",
                                           leader=exc.leader_url).model_dump(exclude_none=True),
                                status_code=503, headers=headers)
        return error_reply(str(exc), status, {"Retry-After": str(after)} if after else None)

    for kind in (*REFUSALS, RegistryRefused):
        app.add_exception_handler(kind, refused)


def refusal_doc(description: str) -> dict[str, Any]:
    return {"model": ErrorReply, "description": description}
