"""The agent's control API: a thin router over :class:`worker.agent.Agent`.

Errors are mapped here, in one place: :class:`~worker.agent.Conflict` is 409 and a
malformed body is 422, both as ``{"error": ...}`` JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from worker.agent import Agent, Conflict
from worker.metrics import CONTENT_TYPE
from worker.schemas import AssignRequest, ReleaseRequest, SleepRequest, StateBody
from worker.settings import AgentSettings

router = APIRouter()


def _agent(request: Request) -> Agent:
    return request.app.state.agent  # type: ignore[no-any-return]


@router.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/state", response_model=StateBody)
async def get_state(request: Request) -> StateBody:
    return _agent(request).view()


@router.post("/assign", status_code=202, response_model=StateBody)
async def assign(body: AssignRequest, request: Request) -> StateBody:
    agent = _agent(request)
    await agent.assign(body)
    return agent.view()


@router.post("/release", response_model=StateBody)
async def release(request: Request, body: ReleaseRequest | None = None) -> JSONResponse:
    agent = _agent(request)
    started = await agent.release(body or ReleaseRequest())
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.post("/sleep", response_model=StateBody)
async def sleep(request: Request, body: SleepRequest | None = None) -> JSONResponse:
    agent = _agent(request)
    started = await agent.sleep(body or SleepRequest())
    return JSONResponse(agent.view().model_dump(mode="json"), status_code=202 if started else 200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_agent(request).metrics.render(), media_type=CONTENT_TYPE)


def _problems(exc: RequestValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        lines.append(f"{loc or '(body)'}: {msg}")
    return lines


def create_app(settings: AgentSettings, **agent_deps: Any) -> FastAPI:
    """The agent's app; ``agent_deps`` go to :class:`Agent` (tests pass fakes)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        agent = Agent(settings, **agent_deps)
        app.state.agent = agent
        await agent.start()
        try:
            yield
        finally:
            await agent.stop()

    app = FastAPI(title="Thaw worker agent", lifespan=lifespan)
    app.include_router(router)

    @app.exception_handler(Conflict)
    async def conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"error": str(exc), "state": exc.state.value}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = _problems(exc)
        return JSONResponse({"error": "invalid request body: " + "; ".join(problems), "problems": problems},
                            status_code=422)

    return app
