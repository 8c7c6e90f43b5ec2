"""A stand-in for vLLM's OpenAI server, for activator unit tests: streams N chunks."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.waiting import wait_until
from thaw.embedded_store import free_port
from thaw.serve import ConnectionLimits, server_config


class FakeEngine:
    def __init__(self, name: str = "fake", tokens: int = 5, die_after_chunks: int | None = None) -> None:
        self.name = name
        self.tokens = tokens
        self.die_after_chunks = die_after_chunks
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.token_delay_s = 0.0
        # The text of every answer (non-streamed: all of it; streamed: each chunk's), instead of tokN.
        self.reply: str | None = None
        # Refuse every request with this status, echoing its prompt as vLLM's refusals may.
        self.refuse_status: int | None = None
        # Go silent (a stalled link or engine): before answering at all, or in a stream
        # after this many chunks (0: after the headers, before any chunk); until reset.
        self.stall_before_headers = False
        self.stall_after_chunks: int | None = None
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        async def handle(request: Request, kind: str) -> Response:
            body = await request.json()
            self.requests.append({"kind": kind, "body": body, "request_id": request.headers.get("x-request-id"),
                                  "traceparent": request.headers.get("traceparent")})
            while self.stall_before_headers:  # noqa: ASYNC110 - let go from the test's thread
                await asyncio.sleep(0.05)  # not a poll: the engine stalls until the test lets go
            if body.get("model") != "served-demo":
                return JSONResponse({"error": {"message": "wrong model", "type": "NotFoundError", "param": None,
                                               "code": 404}}, status_code=404)
            if self.refuse_status is not None:
                prompt = json.dumps(body.get("messages") or body.get("prompt"))
                return JSONResponse({"error": {"message": f"cannot serve this prompt: {prompt}",
                                               "type": "BadRequestError", "param": None,
                                               "code": self.refuse_status}}, status_code=self.refuse_status)
            if not body.get("stream"):
                text = self.reply if self.reply is not None else " ".join(f"tok{i}" for i in range(self.tokens))
                return JSONResponse({"id": "x", "object": "chat.completion", "model": body["model"],
                                     "engine": self.name,
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                  "finish_reason": "length"}],
                                     "usage": {"prompt_tokens": 3, "completion_tokens": self.tokens,
                                               "total_tokens": 3 + self.tokens}})

            async def gen() -> AsyncIterator[bytes]:
                try:
                    for i in range(self.tokens):
                        if self.die_after_chunks is not None and i >= self.die_after_chunks:
                            raise RuntimeError("engine died")
                        while self.stall_after_chunks is not None and i >= self.stall_after_chunks:  # noqa: ASYNC110
                            await asyncio.sleep(0.05)  # not a poll: the engine stalls until the test lets go
                        chunk = {"id": "x", "object": "chat.completion.chunk", "model": body["model"],
                                 "choices": [{"index": 0, "delta": {"content": self.reply or f"tok{i} "}, "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n".encode()
                        await asyncio.sleep(self.token_delay_s)  # not a poll: the engine's pace between tokens
                    if (body.get("stream_options") or {}).get("include_usage"):
                        usage = {"prompt_tokens": 3, "completion_tokens": self.tokens,
                                 "total_tokens": 3 + self.tokens}
                        yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise

            return StreamingResponse(gen(), media_type="text/event-stream")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await handle(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await handle(request, "completions")

        return app


@contextmanager
def serve_app(app: Any, *, lifespan: Literal["auto", "on", "off"] = "auto", timeout_s: float = 20.0,
              limits: ConnectionLimits | None = None) -> Iterator[str]:
    """Run the ASGI ``app`` on a free loopback port in a thread (with its lifespan);
    yields its base URL, and fails the test if it does not start or stop in time. With
    ``limits``, served as Thaw's services are (``thaw.serve.server_config``: the guarded
    protocol with those connection limits)."""
    port = free_port()
    config = (uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan=lifespan)
              if limits is None else server_config(app, "127.0.0.1", port, lifespan=lifespan, limits=limits))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until("the server started (or its thread ended)", lambda: server.started or not thread.is_alive(),
                   timeout_s)
        if not server.started:
            raise RuntimeError("the server did not start")
    except (AssertionError, RuntimeError):
        server.should_exit = True
        raise
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        assert not thread.is_alive(), "the server did not stop"


@contextmanager
def serve(engine: FakeEngine) -> Iterator[str]:
    """Run ``engine`` on a free loopback port in a thread; yields its base URL."""
    with serve_app(engine.app) as url:
        yield url


def read_until_closed(sock: Any, timeout_s: float) -> bytes:
    """Everything a server sends on ``sock`` until it closes the connection (a hang
    past ``timeout_s`` per read fails)."""
    sock.settimeout(timeout_s)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out
