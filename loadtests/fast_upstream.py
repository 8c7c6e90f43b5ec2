"""A minimal, fast OpenAI-shaped upstream for `thaw bench activator`.

    python -m loadtests.fast_upstream --port P [--tokens 32] [--itl-ms 0]

Streams ``max_tokens`` (default ``--tokens``) one-token chunks per completion in
vLLM's SSE shape, with the usage chunk when ``stream_options.include_usage`` is set,
then ``data: [DONE]``. It is a bare asyncio HTTP/1.1 server (keep-alive, chunked
responses) so that the upstream costs as little as possible and what a benchmark
measures in front of it is the proxy.

It also answers what the proxies under test ask of an upstream or a pool manager:
``GET /health``, ``GET /v1/models``, and a fixed route table on ``GET /v1/routes``
naming itself as the one replica of ``--model`` (so an activator can use this
process as its pool manager); ``POST /v1/reports`` and ``/v1/demand`` are accepted
and ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

_REASONS = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 411: "Length Required"}


class Upstream:
    def __init__(self, port: int, model: str, tokens: int, itl_s: float) -> None:
        self.port = port
        self.model = model
        self.tokens = tokens
        self.itl_s = itl_s
        self.url = f"http://127.0.0.1:{port}"

    # -- HTTP/1.1 over asyncio streams ------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, self._request)

    async def _request(self, method: str, target: str, headers: dict[str, str], body: bytes,
                       w: asyncio.StreamWriter) -> None:
        path, _, query = target.partition("?")
        await self.dispatch(method, path, body, w, query)

    async def dispatch(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter, query: str = "") -> None:
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                return _send(w, 400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return await self.complete(path.endswith("chat/completions"), req, w)
        if method == "GET" and path in ("/health", "/healthz"):
            return _send(w, 200, {"ok": True})
        if method == "GET" and path == "/v1/models":
            return _send(w, 200, {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "bench"}]})
        if method == "GET" and path == "/v1/routes":
            # A long poll, as the pool manager's: the table never changes, so a caller
            # that has it waits out its wait_s.
            params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            if int(params.get("since", "-1")) >= 1:
                await asyncio.sleep(min(float(params.get("wait_s", "0")), 60.0))
            return _send(w, 200, self.route_table())
        if method == "POST" and path in ("/v1/reports", "/v1/demand", "/v1/cold_starts"):
            return _send(w, 204, None)
        return _send(w, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    def route_table(self) -> dict[str, Any]:
        replica = {"worker_id": "upstream", "url": self.url, "served_model_name": self.model,
                   "assignment_id": "bench", "phases": {}}
        return {"epoch": "bench", "version": 1, "models": {self.model: {
            "served_name": self.model, "replicas": [replica], "loading": 0, "failures": 0, "error": None,
            "backoff_until": None}}}

    async def complete(self, chat: bool, req: dict[str, Any], w: asyncio.StreamWriter,
                       model: str | None = None) -> None:
        """One completion of ``model`` (default: this upstream's)."""
        model = model or self.model
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or self.tokens)
        created = int(time.time())
        rid = f"cmpl-{id(req):x}"
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        if not req.get("stream"):
            text = " tok" * n
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat else {"index": 0, "text": text, "finish_reason": "length"})
            return _send(w, 200, {"id": rid, "object": obj, "created": created, "model": model,
                                  "choices": [choice], "usage": usage})
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        obj_chunk = "chat.completion.chunk" if chat else "text_completion"
        prefix = (f'data: {{"id":"{rid}","object":"{obj_chunk}","created":{created},'
                  f'"model":"{model}","choices":[').encode()
        if chat:
            token = prefix + b'{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
            last = prefix + b'{"index":0,"delta":{"content":" tok"},"finish_reason":"length"}]}\n\n'
        else:
            token = prefix + b'{"index":0,"text":" tok","finish_reason":null}]}\n\n'
            last = prefix + b'{"index":0,"text":" tok","finish_reason":"length"}]}\n\n'
        for i in range(n):
            _chunk(w, last if i == n - 1 else token)
            if self.itl_s > 0:
                await w.drain()
                await asyncio.sleep(self.itl_s)
        if (req.get("stream_options") or {}).get("include_usage"):
            _chunk(w, prefix[:-len(b'"choices":[')] + b'"choices":[],"usage":' + json.dumps(usage).encode()
                   + b"}\n\n")
        _chunk(w, b"data: [DONE]\n\n")
        w.write(b"0\r\n\r\n")


OnRequest = Callable[[str, str, dict[str, str], bytes, asyncio.StreamWriter], Awaitable[None]]


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_request: OnRequest) -> None:
    """Requests of one keep-alive connection, one at a time, each answered by
    ``on_request(method, target, headers, body, writer)``, until the client closes it."""
    try:
        while True:
            method, target, headers, body = await read_request(reader)
            await on_request(method, target, headers, body, writer)
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    """One HTTP/1.1 request: method, target, headers (names in lower case), body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if ":" in line)}
    body = b""
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    return method, target, headers, body


def _chunk(w: asyncio.StreamWriter, data: bytes) -> None:
    w.write(b"%x\r\n%s\r\n" % (len(data), data))


def _send(w: asyncio.StreamWriter, status: int, body: Any) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    ctype = b"content-type: application/json\r\n" if body is not None else b""
    w.write(b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\n\r\n%s"
            % (status, _REASONS.get(status, "OK").encode(), ctype, len(data), data))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


async def serve(up: Upstream, ready: asyncio.Event | None = None) -> None:
    server = await asyncio.start_server(up.handle, "127.0.0.1", up.port, backlog=4096)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="bench")
    p.add_argument("--tokens", type=int, default=32, help="tokens per completion without max_tokens")
    p.add_argument("--itl-ms", type=float, default=0.0, help="pause between tokens (default 0)")
    args = p.parse_args(argv)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(Upstream(args.port, args.model, args.tokens, args.itl_ms / 1000)))


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    main()
