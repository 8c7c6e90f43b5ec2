"""What the HTTP APIs share about their refusals: the ``Allow`` header of a 405."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from starlette.routing import BaseRoute, Match


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
