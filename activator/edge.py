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

In front of everything, ``RequestGuard`` bounds each request before any route sees it:
its headers (431) and the time its body may take to arrive (408); see
docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    MutableMapping,
)
from typing import Any, Protocol

from starlette.responses import Response

from activator.bounds import RequestBounds, check_headers
from activator.errors import ApiError, RequestTimeout, error_response
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

    @property
    def scope(self) -> Scope: ...

    def stream(self) -> AsyncIterator[bytes]: ...


class RawRequest:
    """A request straight from the ASGI scope: header names lower-case (the first of
    repeated ones wins, as with Starlette), and the body as it arrives."""

    __slots__ = ("headers", "scope", "_receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        self.headers = headers
        self.scope = scope
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


def request_id_from(request: IncomingRequest) -> str:
    rid = request.headers.get("x-request-id", "")
    if rid and len(rid) <= 128 and rid.isprintable():
        return rid
    # A name, not a secret: no need for os.urandom, which lets go of the GIL and then
    # waits to take it back from the ledger's thread.
    return f"{random.getrandbits(128):032x}"


def client_address(request: IncomingRequest) -> str:
    """The client's address as the server put it in the scope (uvicorn: the peer, or
    X-Forwarded-For from a trusted proxy)."""
    client = request.scope.get("client")
    return str(client[0]) if client else "unknown"


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


class FinalChunk(bytes):
    """The last piece of a streamed answer, yielded once everything its end waits for
    is done: it goes out with the response's own end (the chunked terminator) in one
    write, not two."""


class ProxyStream(Response):
    """A streamed answer. ``chunks`` is closed whatever happens (its ``finally`` frees the
    replica and records the request); a client that disconnects cancels it. A
    :class:`FinalChunk` ends it."""

    def __init__(self, chunks: AsyncGenerator[bytes, None], status_code: int, headers: Mapping[str, str],
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
            final = False
            async for chunk in self.chunks:
                final = isinstance(chunk, FinalChunk)
                if final:
                    streaming = False
                await send({"type": "http.response.body", "body": chunk, "more_body": not final})
                if final:
                    break
            if not final:
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
                await self.chunks.aclose()


class RequestGuard:
    """ASGI middleware in front of the whole app: every request's headers are bounded
    (431), and its body must arrive within ``body_timeout_s`` of the start of its
    handling (408 where an answer can still be sent). An answer sent before the body was
    read to its end closes the connection afterwards: a client that goes on sending it,
    however slowly, holds nothing. (The headers' own deadline, and their bound on the
    wire, are the connection's business: ``thaw.serve``.)"""

    def __init__(self, app: ASGIApp, bounds: RequestBounds, body_timeout_s: float,
                 slow_bodies: dict[tuple[str, str], float] | None = None) -> None:
        """``slow_bodies``: (method, path) -> its own body timeout (a file upload's)."""
        self.app = app
        self.bounds = bounds
        self.body_timeout_s = body_timeout_s
        self.slow_bodies = slow_bodies or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_headers(scope["headers"], self.bounds)
        except ApiError as exc:
            rid = request_id_from(RawRequest(scope, receive))
            await error_response(exc, {"x-request-id": rid, "connection": "close"})(scope, receive, send)
            return
        timeout_s = self.slow_bodies.get((scope["method"], scope["path"]), self.body_timeout_s)
        deadline = asyncio.get_running_loop().time() + timeout_s
        body_read = not _has_body(scope["headers"])
        started = False

        async def bounded_receive() -> Message:
            nonlocal body_read
            if body_read:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read = True
            return message

        async def closing_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not body_read:
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, bounded_receive, closing_send)
        except RequestTimeout as exc:
            # A route that let the timeout through (the completion routes answer it themselves).
            if started:
                raise
            rid = request_id_from(RawRequest(scope, receive))
            await error_response(exc, {"x-request-id": rid})(scope, receive, closing_send)


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False
