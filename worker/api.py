"""The agent's control API: a thin router over :class:`worker.agent.Agent` and its parts
(``agent.kept``, ``agent.releases``, ``agent.sleep_mode``, ``agent.adapters``).

Errors are mapped here, in one place: :class:`~worker.errors.Conflict` is 409,
:class:`~worker.errors.Refused` 403 and a malformed body 422, each as ``{"error": ...}``
JSON. Every endpoint but ``/healthz`` needs the cluster token (401 without it) when the
settings carry one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi import Path as FastApiPath
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from thaw.auth import ClusterAuth, document_cluster_auth
from thaw.controllers import TERM_HEADER, UNTIL_HEADER
from thaw.http_api import refuse_in_api_shape
from thaw.log import get_logger
from thaw.telemetry import TRACEPARENT
from thaw.wire import (
    AdapterRequest,
    AdapterUnload,
    AssignRequest,
    ErrorReply,
    PrebuildRequest,
    ReleaseRequest,
    SleepRequest,
    WorkerStatus,
)
from worker.adapters import AdapterConflict
from worker.agent import Agent
from worker.engines import PackedEngines
from worker.errors import Conflict, Refused
from worker.fence import Fence
from worker.heartbeat import Heartbeat
from worker.metrics import CONTENT_TYPE
from worker.settings import AgentSettings

log = get_logger()

router = APIRouter()
# The refusals of the calls that change the worker's state (in /openapi.json).
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorReply, "description": "Not in this state (the answer names it)"}}


class NoSuchEngine(LookupError):
    """A packed engine this worker does not run (404)."""


def _agent(request: Request) -> Agent:
    """The agent a call is for: this worker's own, or under ``/engines/{engine_id}`` one
    of its packed engines (``worker.engines``)."""
    engine_id = request.path_params.get("engine_id")
    if engine_id is None:
        return request.app.state.agent  # type: ignore[no-any-return]
    agent = request.app.state.engines.get(engine_id)
    if agent is None:
        raise NoSuchEngine(f"no packed engine {engine_id!r} on this worker")
    return agent  # type: ignore[no-any-return]


@router.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/state", response_model=WorkerStatus)
async def get_state(request: Request) -> WorkerStatus:
    return _agent(request).view()


@router.post("/assign", status_code=202, response_model=WorkerStatus, responses={
    **CONFLICT, 403: {"model": ErrorReply, "description": "Never here (e.g. a URI outside the allowed prefixes)"}})
async def assign(body: AssignRequest, request: Request) -> WorkerStatus:
    agent = _agent(request)
    agent.load_traces.assigned(body.assignment_id, request.headers.get(TRACEPARENT))
    await agent.assign(body)
    return agent.view()


@router.post("/prebuild", response_model=WorkerStatus, responses={
    **CONFLICT, 403: {"model": ErrorReply, "description": "Never here (e.g. a URI outside the allowed prefixes)"},
    202: {"model": WorkerStatus, "description": "Building the engine"}})
async def prebuild(body: PrebuildRequest, request: Request) -> JSONResponse:
    agent = _agent(request)
    agent.check_uri(body.uri, body.model)
    started = await agent.kept.prebuild(body)
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.post("/release", response_model=WorkerStatus,
             responses={**CONFLICT, 202: {"model": WorkerStatus, "description": "Draining started"}})
async def release(request: Request, body: ReleaseRequest | None = None) -> JSONResponse:
    agent = _agent(request)
    started = await agent.releases.release(body or ReleaseRequest())
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.post("/sleep", response_model=WorkerStatus,
             responses={**CONFLICT, 202: {"model": WorkerStatus, "description": "Going to sleep"}})
async def sleep(request: Request, body: SleepRequest | None = None) -> JSONResponse:
    agent = _agent(request)
    started = await agent.sleep_mode.sleep(body or SleepRequest())
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.post("/adapters", response_model=WorkerStatus, responses={
    **CONFLICT, 403: {"model": ErrorReply, "description": "Never here (e.g. a URI outside the allowed prefixes)"},
    202: {"model": WorkerStatus, "description": "Loading the adapter"}})
async def load_adapter(body: AdapterRequest, request: Request) -> JSONResponse:
    """Load a LoRA adapter into the engine this worker serves (its base's)."""
    agent = _agent(request)
    agent.check_uri(body.uri, body.model)
    started = agent.adapters.load(body)
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.post("/adapters/unload", response_model=WorkerStatus, responses={
    202: {"model": WorkerStatus, "description": "Unloading: draining its requests first"}})
async def unload_adapter(body: AdapterUnload, request: Request) -> JSONResponse:
    agent = _agent(request)
    started = agent.adapters.unload(body.model)
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    return Response(_agent(request).metrics.render(), media_type=CONTENT_TYPE)


# A packed engine's own control API: the calls above, under its id.
def _engine_id(engine_id: Annotated[str, FastApiPath(description="The packed engine's id")]) -> None:
    """Declares the path parameter (``_agent`` reads it from the request)."""


engine_router = APIRouter(prefix="/engines/{engine_id}", dependencies=[Depends(_engine_id)])
for _route in router.routes:
    if getattr(_route, "path", "") not in ("/healthz", "/prebuild"):
        engine_router.add_api_route(
            _route.path, _route.endpoint, methods=list(_route.methods),  # type: ignore[attr-defined]
            status_code=_route.status_code, response_model=_route.response_model,  # type: ignore[attr-defined]
            responses={**_route.responses,  # type: ignore[attr-defined]
                       404: {"model": ErrorReply, "description": "No such packed engine on this worker"}})


@router.post("/engines", status_code=202, response_model=WorkerStatus, responses={
    409: {"model": ErrorReply, "description": "It does not fit (both numbers named), or this worker does not pack"},
    403: {"model": ErrorReply, "description": "Never here (e.g. a URI outside the allowed prefixes)"}})
async def pack(body: AssignRequest, request: Request) -> WorkerStatus:
    """Start a packed engine (``engine_id``, ``memory_bytes``) with its assignment; the
    answer is that engine's status, its control API under ``/engines/{engine_id}``."""
    engines: PackedEngines = request.app.state.engines
    _agent(request).check_uri(body.uri, body.assignment_id)
    return (await engines.create(body, request.headers.get(TRACEPARENT))).view()


def _problems(exc: RequestValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        lines.append(f"{loc or '(body)'}: {msg}")
    return lines


def create_app(settings: AgentSettings, *, on_orphaned: Callable[[], None] | None = None,
               **agent_deps: Any) -> FastAPI:
    """The agent's app; ``agent_deps`` go to :class:`Agent` (tests pass fakes). With a
    controller in the settings it heartbeats there; ``on_orphaned`` is called when it
    gives up (``exit_when_orphaned_s``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        agent = Agent(settings, **agent_deps)
        app.state.agent = agent
        app.state.engines = engines = PackedEngines(agent, agent_deps=agent_deps)
        beat = None
        if settings.controller_url and settings.token:
            beat = Heartbeat(agent.view, settings.controller_url, settings.token,
                             interval_s=settings.heartbeat_interval_s,
                             exit_when_orphaned_s=settings.exit_when_orphaned_s, on_orphaned=on_orphaned,
                             on_failures=agent.metrics.heartbeats.set, fence=fence)
            agent.on_state_change = beat.kick
        app.state.heartbeat = beat
        await agent.start()
        engines.start()
        if beat is not None:
            await beat.start()
        try:
            yield
        finally:
            if beat is not None:
                await beat.close()
            await engines.close()
            await agent.stop()

    app = FastAPI(title="Thaw worker agent", lifespan=lifespan, responses={
        400: {"model": ErrorReply, "description": "The body could not be read (not UTF-8)"},
        422: {"model": ErrorReply, "description": "Malformed request: each field's problem"}})
    app.include_router(router)
    app.include_router(engine_router)
    fence = app.state.fence = Fence()

    @app.middleware("http")
    async def fenced(request: Request, call_next: Any) -> Response:
        # A control call from a controller whose term has passed changes nothing.
        raw = request.headers.get(TERM_HEADER)
        if raw is not None and request.method == "POST":
            try:
                term = int(raw)
                until = float(u) if (u := request.headers.get(UNTIL_HEADER)) is not None else None
            except ValueError:
                return JSONResponse({"error": f"{TERM_HEADER} must be an integer and {UNTIL_HEADER} a number"},
                                    status_code=400)
            now = time.time()
            if not fence.admits(term, until, now):
                log.warning("control_refused", path=request.url.path, term=term, newest_term=fence.term,
                            late_s=None if until is None else round(now - until, 3))
                why = (f"term {fence.term} leads now" if fence.term is not None and term < fence.term
                       else f"its lease ended {now - (until or now):.3f} s before the call arrived")
                return JSONResponse({"error": f"a call of the controllers' term {term}, but {why}: "
                                              "this controller no longer leads"}, status_code=409)
            # What a history checker reads (loadtests/netfaults): which term acted, and when.
            log.info("control_accepted", path=request.url.path, term=term)
        return await call_next(request)  # type: ignore[no-any-return]

    @app.exception_handler(Conflict)
    async def conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"error": str(exc), "state": exc.state.value}, status_code=409)

    @app.exception_handler(AdapterConflict)
    async def adapter_conflict(_: Request, exc: AdapterConflict) -> JSONResponse:
        return JSONResponse({"error": str(exc), "state": exc.state.value}, status_code=409)

    @app.exception_handler(NoSuchEngine)
    async def no_engine(_: Request, exc: NoSuchEngine) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=403)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = _problems(exc)
        return JSONResponse({"error": "invalid request body: " + "; ".join(problems), "problems": problems},
                            status_code=422)

    refuse_in_api_shape(app)

    if settings.token:
        app.add_middleware(ClusterAuth, token=settings.token)
        fastapi_openapi = app.openapi
        app.openapi = lambda: app.openapi_schema or document_cluster_auth(fastapi_openapi())  # type: ignore[method-assign]
    return app
