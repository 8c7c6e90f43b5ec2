"""The completion endpoints' short way through the server: a bare ASGI layer.

Every request pays for what stands between uvicorn and the service. For the two
completion endpoints (and their ``/m/<model>/`` forms) that is all the traffic, so
``CompletionEdge`` takes them before FastAPI's routing, request object and
``StreamingResponse`` (an anyio task group per stream) and hands the service a
:class:`RawRequest` instead; every other path goes on to the FastAPI app unchanged.
``ProxyStream`` sends a streamed answer chunk by chunk and watches for the client's
disconnect with one task, which cancels the stream (and so the upstream request, which
makes vLLM abort it). ``thaw bench activator`` measures what this saves; see
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol

from starlette.responses import Response

from activator.protocol import Kind

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class IncomingRequest(Protocol):
    """What the service reads of a request: Starlette's ``Request`` and ``RawRequest``
    both have it."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


class RawRequest:
    """A request straight from the ASGI scope: header names lower-case (the first of
    repeated ones wins, as with Starlette), and the body as it arrives."""

    __slots__ = ("headers", "_receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        self.headers = headers
        self._receive = receive

    async def stream(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return  # the client left mid-body: what came is all there is
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return


def route_of(path: str) -> tuple[Kind, str | None] | None:
    """(kind, model named in the path) for a completion endpoint; None for any other."""
    kind = ROUTES.get(path)
    if kind is not None:
        return kind, None
    if path.startswith("/m/"):
        model, sep, rest = path[3:].partition("/")
        kind = ROUTES.get("/" + rest) if sep else None
        if kind is not None and model:
            return kind, model
    return None


Handler = Callable[[IncomingRequest, Kind, "str | None"], Awaitable[Response]]


class CompletionEdge:
    """ASGI middleware: POSTs to a completion endpoint go to ``handler``; the rest to ``app``."""

    def __init__(self, app: ASGIApp, handler: Handler) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = route_of(scope["path"])
            if route is not None:
                response = await self.handler(RawRequest(scope, receive), *route)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ProxyStream(Response):
    """A streamed answer. ``chunks`` is closed whatever happens (its ``finally`` frees the
    replica and records the request); a client that disconnects cancels it."""

    def __init__(self, chunks: AsyncIterator[bytes], status_code: int, headers: Mapping[str, str],
                 media_type: str | None) -> None:
        self.chunks = chunks
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        streaming = True
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            if streaming:
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            streaming = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # the client left: nothing more to send, and nothing is wrong
        finally:
            streaming = False
            watcher.cancel()
            with contextlib.suppress(RuntimeError):  # already closed by the loop above
                await self.chunks.aclose()  # type: ignore[attr-defined]
