"""Refusals the schema fuzzer (tests/fuzz/) found in the controller's and the workers'
APIs: each in the APIs' own {"error": ...} shape, and as /openapi.json documents it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

from tests.warm_pool.in_process import TOKEN, fleet_config
from thaw.config import parse_config
from warm_pool.app import create_pool_app
from warm_pool.assembly import build_pool
from warm_pool.fleet.control import HttpWorkerControl


async def test_a_body_that_is_not_utf8_is_a_documented_400_in_the_error_shape() -> None:
    # schemathesis: POST /v1/workers/heartbeat with the body b"\x80\x81" (not UTF-8) answered FastAPI's
    # {"detail": "There was an error parsing the body"}, a 400 /openapi.json did not list.
    with tempfile.TemporaryDirectory() as root:
        data = fleet_config().model_dump(mode="json")
        data["data_dir"] = root
        app = create_pool_app(build_pool(parse_config(data), {}, HttpWorkerControl(TOKEN),
                                         state_dir=Path(root)), TOKEN, manage_lifecycle=False)
        h = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c:
            r = await c.post("/v1/workers/heartbeat", content=b"\x80\x81", headers=h)
            assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
            assert "400" in app.openapi()["paths"]["/v1/workers/heartbeat"]["post"]["responses"]
            # OPTIONS /v1/keys: 405 whose Allow named GET only (POST is another route).
            r = await c.options("/v1/keys", headers=h)
            assert r.status_code == 405 and set(r.json()) == {"error"}
            assert r.headers["allow"] == "GET, POST"
            # /metrics is documented as text, as it answers.
            assert "text/plain" in app.openapi()["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
