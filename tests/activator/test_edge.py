"""The completion endpoints' bare ASGI path: which requests it takes, and what it reads."""

from __future__ import annotations

import asyncio
from typing import Any

from activator.edge import CompletionEdge, RawRequest, route_of


def test_route_of_takes_only_the_completion_endpoints() -> None:
    assert route_of("/v1/chat/completions") == ("chat", None)
    assert route_of("/v1/completions") == ("completions", None)
    assert route_of("/m/demo/v1/chat/completions") == ("chat", "demo")
    assert route_of("/m/demo/v1/completions") == ("completions", "demo")
    for other in ("/v1/models", "/m//v1/completions", "/m/demo/v1/models", "/v1/chat/completions/",
                  "/m/demo", "/healthz", "/v1/completionsx"):
        assert route_of(other) is None, other


def test_raw_request_reads_headers_and_the_body_as_it_arrives() -> None:
    messages = [{"type": "http.request", "body": b'{"a":', "more_body": True},
                {"type": "http.request", "body": b"1}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"headers": [(b"authorization", b"Bearer k1"), (b"authorization", b"Bearer k2"),
                         (b"x-request-id", b"r")]}

    async def body() -> bytes:
        req = RawRequest(scope, receive)
        assert req.headers == {"authorization": "Bearer k1", "x-request-id": "r"}  # the first one wins
        return b"".join([c async for c in req.stream()])

    assert asyncio.run(body()) == b'{"a":1}'


def test_everything_else_goes_to_the_app() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(f"{scope['method']} {scope['path']}")

    async def handler(*_: Any) -> Any:
        raise AssertionError("not a completion")

    edge = CompletionEdge(app, handler)

    async def nothing() -> dict[str, Any]:
        return {}

    async def ignore(_: Any) -> None:
        pass

    for method, path in (("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("POST", "/m/x/v1/embeddings")):
        asyncio.run(edge({"type": "http", "method": method, "path": path, "headers": []}, nothing, ignore))
    assert seen == ["GET /v1/chat/completions", "POST /v1/models", "POST /m/x/v1/embeddings"]
