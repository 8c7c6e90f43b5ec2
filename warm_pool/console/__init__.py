"""The operators' console: one page the controller serves at ``/console`` (static files in
this package, no build step) that reads ``/v1/state`` and ``/v1/events`` with the
operator's token and redraws every two seconds: the models with their replicas, tier
and last cold start by phase, the pools with their standby band, target and spend
against the budget, the workers, and the recent decisions with their reasons. When the
controller stops answering it says so, and what it last saw stays on the page.

The page itself needs no token (a browser does not send one when it opens a page); its
calls do: the cluster token, or an admin key (``thaw admin-keys add``), which the
controller admits on these reads (docs/guide/monitoring.md, "The console").
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

# The page's files and the API reads an admin key may make for it.
ASSETS = {"/console": ("index.html", "text/html; charset=utf-8"),
          "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
          "/console/console.css": ("console.css", "text/css; charset=utf-8")}
READS = frozenset({"/v1/state", "/v1/events"})

router = APIRouter(include_in_schema=False)


def _asset(name: str, media_type: str) -> Response:
    body = files(__package__).joinpath(name).read_bytes()
    return Response(body, media_type=media_type, headers={"cache-control": "no-cache",
                                                          "content-security-policy": "default-src 'self'"})


for _path, (_name, _media) in ASSETS.items():
    router.add_api_route(_path, lambda name=_name, media=_media: _asset(name, media), methods=["GET"])
