"""The completion endpoints' bare ASGI path: which requests it takes, and what it reads."""

from __future__ import annotations

import asyncio
from typing import Any

from activator.edge import CompletionEdge, FinalChunk, ProxyStream, RawRequest, route_of


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


def _stream(pieces: list[bytes]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages a ProxyStream of ``pieces`` sends, and what its generator saw."""
    sent: list[dict[str, Any]] = []
    seen: list[str] = []

    async def chunks() -> Any:
        try:
            for piece in pieces:
                yield piece
            seen.append("exhausted")
        finally:
            seen.append("closed")

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(ProxyStream(chunks(), 200, {}, "text/event-stream")({"type": "http"}, receive, send))
    return sent, seen


def test_a_final_chunk_goes_out_with_the_end_of_the_response() -> None:
    sent, seen = _stream([b"data: 1\n\n", FinalChunk(b"data: [DONE]\n\n"), b"never"])
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: 1\n\n", True), (b"data: [DONE]\n\n", False)]
    assert seen == ["closed"]  # closed at the final chunk: nothing after it is read


def test_a_stream_without_a_final_chunk_ends_with_an_empty_one() -> None:
    sent, seen = _stream([b"data: 1\n\n", b"data: [DONE]\n\n"])
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"data: 1\n\n", True), (b"data: [DONE]\n\n", True), (b"", False)]
    assert seen == ["exhausted", "closed"]
