"""How the controller tells a worker what to do: the ``WorkerControl`` protocol and its
HTTP implementation (with the cluster token). Unit tests use an in-memory fake."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import httpx
from pydantic import BaseModel

from thaw.auth import bearer
from thaw.controllers import TERM_HEADER, UNTIL_HEADER
from thaw.telemetry import TRACEPARENT
from thaw.wire import (
    AdapterRequest,
    AdapterUnload,
    AssignRequest,
    PrebuildRequest,
    ReleaseRequest,
    SleepRequest,
    WorkerStatus,
)
from warm_pool.fleet.start_traces import CONTROL_TRACE


class ControlError(Exception):
    """A control call that did not take effect. ``status`` is the worker's HTTP status
    (409: not possible in its state), or None when it could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WorkerControl(Protocol):
    async def assign(self, control_url: str, req: AssignRequest) -> WorkerStatus: ...
    async def release(self, control_url: str, req: ReleaseRequest) -> WorkerStatus: ...
    async def sleep(self, control_url: str, req: SleepRequest) -> WorkerStatus: ...
    async def prebuild(self, control_url: str, req: PrebuildRequest) -> WorkerStatus: ...
    # A packed engine on the worker at control_url (pools[].pack): the answer is its status.
    async def pack(self, control_url: str, req: AssignRequest) -> WorkerStatus: ...
    async def load_adapter(self, control_url: str, req: AdapterRequest) -> WorkerStatus: ...
    async def unload_adapter(self, control_url: str, req: AdapterUnload) -> WorkerStatus: ...
    # Every call carries ``term()``, the term it is decided in, and ``until()``, when the
    # sender's lease ends by its own count (warm_pool.fencing).
    def fence(self, term: Callable[[], int | None], until: Callable[[], float] | None = None) -> None: ...
    async def close(self) -> None: ...


# Control calls in flight at once. A burst assigns a thousand workers in one tick, and
# httpx's pool scans every request waiting in it for each one it places (quadratic: a
# third of the controller's loop in such a burst); beyond this many they wait here, in
# order, each for a few milliseconds of a worker's answer.
CONTROL_CALLS = 64


class HttpWorkerControl:
    def __init__(self, token: str, *, timeout_s: float = 10.0) -> None:
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=2.0), headers=bearer(token))
        self._term: Callable[[], int | None] = lambda: None
        self._until: Callable[[], float] | None = None
        self._calls = asyncio.Semaphore(CONTROL_CALLS)

    def fence(self, term: Callable[[], int | None], until: Callable[[], float] | None = None) -> None:
        """Send the leader's term with every call, and when its lease ends by its own
        count (``worker.fence``): a worker that has heard of a newer term, or that gets
        the call after that moment, refuses it."""
        self._term = term
        self._until = until

    def __repr__(self) -> str:
        return "HttpWorkerControl()"

    async def _call(self, control_url: str, path: str, body: BaseModel) -> WorkerStatus:
        try:
            async with self._calls:
                term = self._term()
                headers = {TERM_HEADER: str(term)} if term is not None else {}
                if term is not None and self._until is not None:
                    headers[UNTIL_HEADER] = f"{self._until():.3f}"
                traced = CONTROL_TRACE.get()
                if traced is not None:
                    headers[TRACEPARENT] = traced
                r = await self._http.post(f"{control_url.rstrip('/')}{path}", json=body.model_dump(mode="json"),
                                          headers=headers or None)
        except httpx.HTTPError as exc:
            raise ControlError(f"{path} to {control_url}: {exc or type(exc).__name__}") from None
        if r.status_code >= 400:
            raise ControlError(f"{path} to {control_url} refused ({r.status_code}): {r.text[:500]}", r.status_code)
        try:
            return WorkerStatus.model_validate_json(r.content)
        except ValueError as exc:
            raise ControlError(f"{path} to {control_url}: unreadable answer ({exc})", r.status_code) from None

    async def assign(self, control_url: str, req: AssignRequest) -> WorkerStatus:
        return await self._call(control_url, "/assign", req)

    async def release(self, control_url: str, req: ReleaseRequest) -> WorkerStatus:
        return await self._call(control_url, "/release", req)

    async def sleep(self, control_url: str, req: SleepRequest) -> WorkerStatus:
        return await self._call(control_url, "/sleep", req)

    async def prebuild(self, control_url: str, req: PrebuildRequest) -> WorkerStatus:
        return await self._call(control_url, "/prebuild", req)

    async def pack(self, control_url: str, req: AssignRequest) -> WorkerStatus:
        return await self._call(control_url, "/engines", req)

    async def load_adapter(self, control_url: str, req: AdapterRequest) -> WorkerStatus:
        return await self._call(control_url, "/adapters", req)

    async def unload_adapter(self, control_url: str, req: AdapterUnload) -> WorkerStatus:
        return await self._call(control_url, "/adapters/unload", req)

    async def close(self) -> None:
        await self._http.aclose()
