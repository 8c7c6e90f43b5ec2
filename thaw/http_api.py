"""What the control APIs (controller, worker) share about their refusals: Starlette's
own in their ``{"error": ...}`` shape, and the ``Allow`` header of a 405."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match


def refuse_in_api_shape(app: FastAPI) -> None:
    """Starlette's own refusals (a body that is not UTF-8, an unknown path or method)
    answer ``{"error": ...}``, not FastAPI's ``{"detail": ...}``; a 405 names every
    method the path allows."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(app.router.routes, request.scope)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=headers)


def allowed_methods(routes: Iterable[BaseRoute], scope: MutableMapping[str, Any]) -> str:
    """The ``Allow`` header of a 405 for ``scope``'s path: the methods of every route
    with that path (Starlette names only the first route's, and FastAPI makes one route
    per method)."""
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))
