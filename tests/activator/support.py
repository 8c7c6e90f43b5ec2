"""What the activator's tests share: a config with two models and two tenants, route
tables naming fake replicas, usage records, the check of an OpenAI-shaped error, and a tokenizer
fetcher reading a model directory."""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from activator.ledger import UsageRecord
from thaw.config import ThawConfig, hash_api_key, parse_config
from thaw.wire import RouteTable

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thaw.yaml"
KEY, LIMITED_KEY = "key-all", "key-limited"


def make_config(data_dir: Path | None = None, **autoscaling: Any) -> ThawConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["data_dir"] = str(data_dir or Path(tempfile.mkdtemp(prefix="thaw-act-")))
    demo = data["models"][0]
    demo["autoscaling"].update({"activation_timeout_s": 2, "max_queue_length": 3, **autoscaling})
    other = copy.deepcopy(demo)
    other.update({"name": "other", "served_name": "other", "uri": "s3://thaw/models/other"})
    data["models"].append(other)
    data["server"]["max_body_bytes"] = 2000
    data["tenants"] = [
        {"name": "all", "api_key_hashes": [hash_api_key(KEY)], "allowed_models": ["*"]},
        {"name": "limited", "api_key_hashes": [hash_api_key(LIMITED_KEY)], "allowed_models": ["other"]},
    ]
    return parse_config(data)


def table(version: int, replicas: list[dict[str, Any]] | None = None, **demo: Any) -> RouteTable:
    entry = {"served_name": "thaw-demo", "replicas": replicas or [], "loading": 0, "failures": 0,
             "error": None, "backoff_until": None, **demo}
    return RouteTable.model_validate({"epoch": "e1", "version": version, "models": {"demo": entry}})


def replica(url: str, wid: str = "w1", assignment: str = "demo-1") -> dict[str, Any]:
    return {"worker_id": wid, "url": url, "served_model_name": "served-demo", "assignment_id": assignment,
            "phases": {"assigned": None, "snapshot_restored": None, "weights_loaded": None, "engine_ready": None}}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert r.headers["x-request-id"]
    return err


def record(i: int, tenant: str = "a", **kw: object) -> UsageRecord:
    base = dict(request_id=f"r{i}", tenant=tenant, model="demo", status=200, error_code=None,
                prompt_tokens=10, completion_tokens=5, cached_tokens=0, usage_source="engine", queue_ms=0.0,
                ttft_ms=12.0, duration_ms=30.0, cold_start=False, cancelled=False, stream=True,
                replica="demo-1", started_at=1000.0 + i, finished_at=1000.5 + i)
    base.update(kw)
    return UsageRecord(**base)  # type: ignore[arg-type]


def fetcher(model_dir: Path):  # type: ignore[no-untyped-def]
    """A TokenCounter fetch function serving the tokenizer files in model_dir."""

    def fetch(uri: str, name: str) -> bytes | None:
        path = model_dir / name
        return path.read_bytes() if path.exists() else None

    return fetch


def controller_stand_in(routes: RouteTable, db: Any) -> Any:
    """A controller as an activator sees it: ``routes`` as its route table, no keys, every
    report accepted, and the real Files, Batches and stored-responses APIs on ``db`` (a
    ``warm_pool.db.Db``), refusing as the controller does. Its batches fail validation:
    it has no store."""
    import time

    from fastapi import FastAPI
    from fastapi.responses import Response

    from thaw.wire import KeyTable
    from warm_pool.api.errors import install
    from warm_pool.batch.api import batch_router
    from warm_pool.batch.files import FileIndex
    from warm_pool.batch.files_api import files_router
    from warm_pool.batch.runner import BatchRunner
    from warm_pool.batch.store import BatchStore
    from warm_pool.conversations.api import responses_router
    from warm_pool.conversations.store import ResponseStore

    app = FastAPI()
    install(app)
    files, batches = FileIndex(db), BatchStore(db)
    runner = BatchRunner(batches, files, None, "thaw", "files/", resolver=lambda tenant: lambda model: None,
                         clock=time.time)
    app.include_router(files_router(files, time.time))
    app.include_router(batch_router(batches, files, runner, time.time))
    app.include_router(responses_router(ResponseStore(db), time.time))

    @app.get("/v1/routes")
    async def route_table() -> Response:
        return Response(routes.model_dump_json(), media_type="application/json")

    @app.get("/v1/keys")
    async def keys() -> Response:
        return Response(KeyTable(version=0, keys=[]).model_dump_json(), media_type="application/json")

    @app.post("/v1/{anything:path}")
    async def accepted() -> Response:
        return Response(status_code=204)

    return app


@contextlib.asynccontextmanager
async def served_in_this_loop(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on loopback, on the test's own event loop (what the test
    does to its routes happens there, as its controller feed's would); its base URL."""
    import asyncio

    import uvicorn

    from tests.waiting import until
    from thaw.embedded_store import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    task = asyncio.ensure_future(server.serve())
    await until("the app serving", lambda: server.started or task.done(), 20)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)
