"""How a route's call is answered: the one place where a refusal (``ApiError``) or a
failure becomes OpenAI's error shape with the request id. Routes raise; none maps
errors itself.

- :func:`engine_call`: a request served by the engines (a completion, a response),
  recorded in the usage ledger and observed in the metrics, whatever its outcome.
- :func:`tenant_call`: a request about the tenant's own objects (files, batches,
  stored responses, conversations), answered by its service.
- :func:`install_error_handlers`: the framework's refusals and an ``ApiError`` raised by
  a route.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from activator.api.parts import ActivatorParts
from activator.context import RequestContext
from activator.edge import IncomingRequest, request_id_from
from activator.errors import (
    ApiError,
    BadRequest,
    NotFound,
    TooManyFailedAuth,
    error_body,
    error_response,
    internal_error_response,
)
from thaw.http_api import allowed_methods
from thaw.log import bind_request, get_logger
from thaw.telemetry import TRACEPARENT, parse_traceparent, start_trace

log = get_logger()


async def engine_call(parts: ActivatorParts, request: IncomingRequest, kind: str,
                      call: Callable[[RequestContext], Awaitable[Response]]) -> Response:
    """A request served by the engines (a completion, a response): its errors in
    OpenAI's shape, each recorded once."""
    service = parts.service
    ctx = RequestContext(request_id=request_id_from(request), arrival=time.time())
    if service.tracing is not None:
        parent = parse_traceparent(request.headers.get(TRACEPARENT))
        ctx.trace = start_trace(parent, service.tracing.ratio)
        ctx.trace_parent_id = parent.span_id if parent is not None else None
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
                 cold_start=ctx.cold, queue_ms=round(ctx.queue_s * 1000), held=ctx.held)
        return response


async def tenant_call(parts: ActivatorParts, request: Request, call: Callable[[str], Awaitable[Any]],
                      kind: str) -> Response:
    """``call`` with the authenticated tenant; its dict as JSON, or its response, with
    the request id."""
    rid = request_id_from(request)
    with bind_request(rid, kind=kind):
        try:
            principal = parts.service.principal(request)
            out = await call(principal.tenant)
        except ApiError as exc:
            return error_response(exc, {"x-request-id": rid})
        except Exception:
            log.exception(f"{kind}_request_failed")
            return internal_error_response(rid, {"x-request-id": rid})
    if isinstance(out, Response):
        out.headers["x-request-id"] = rid
        return out
    return JSONResponse(out, headers={"x-request-id": rid})


async def json_body(request: Request) -> Any:
    """The request's body as JSON, or a 400."""
    try:
        return json.loads(await request.body())
    except ValueError:
        raise BadRequest("the body is not JSON") from None


def install_error_handlers(app: FastAPI) -> None:
    """Answer the framework's own refusals (no route, wrong method, a malformed
    parameter) and any ``ApiError`` raised by a route in OpenAI's shape."""

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
