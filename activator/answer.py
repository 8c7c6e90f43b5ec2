"""One answer's way back from a replica: the request sent (retried once on another replica
when the first fails before its first byte), then answered whole or streamed through,
or (a stream held for a cold start) answered 200 at once with progress comments until
its first token (``activator.held``).

Streams are passed through byte for byte; a failure after the first byte becomes an SSE
error event followed by ``data: [DONE]``. A client that disconnects closes the upstream
request, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fastapi.responses import Response

from activator.context import RequestContext
from activator.edge import FinalChunk, ProxyStream
from activator.errors import (
    ApiError,
    UpstreamError,
    error_body,
    internal_error_body,
    sse_error_event,
    upstream_error_body,
)
from activator.held import error_event, held_phase, progress_comment, ready_comment
from activator.metrics import ActivatorMetrics
from activator.protocol import Kind
from activator.recording import RequestRecorder
from activator.replica_choice import prefix_key
from activator.routing.replicas import Replica
from activator.routing.router import Acquired, Router
from activator.upstream import UpstreamPool, UpstreamResponse
from activator.usage import DONE, StreamTap, usage_from_body
from thaw.config import Model, ThawConfig
from thaw.log import get_logger
from thaw.telemetry import TRACEPARENT

log = get_logger()

UPSTREAM_PATH: dict[Kind, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Headers from the engine that are about the connection, not the content.
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}


def _retryable(exc: BaseException, stream: bool) -> bool:
    """A replica that failed before its first byte, such that another may answer: it
    refused or dropped the connection, or (a stream) sent nothing for the stream idle
    limit, which an engine that is merely busy does not reach. A whole answer that is
    slow is not retried: its replica is working on it."""
    if isinstance(exc, TimeoutError):
        return stream
    return isinstance(exc, ConnectionError)


def upstream_headers(ctx: RequestContext) -> dict[str, str]:
    """What a request to a replica carries besides its body: its id, and (traced) the
    W3C context of the request's span."""
    h = {"x-request-id": ctx.request_id, "content-type": "application/json"}
    if ctx.trace is not None:
        h[TRACEPARENT] = ctx.trace.traceparent()
    return h


class Answers:
    """The proxy half of the completion service (``activator.service`` decides; this
    sends and answers). ``cfg`` is the service's, replaced with it."""

    def __init__(self, cfg: ThawConfig, routes: Router, metrics: ActivatorMetrics, recorder: RequestRecorder,
                 http: UpstreamPool, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.clock = clock
        self.routes = routes
        self.metrics = metrics
        self.recorder = recorder
        self.http = http

    async def answer(self, model: Model, upstream: UpstreamResponse, replica: Replica, first: bytes,
                     client_wants_usage: bool, ctx: RequestContext) -> Response:
        if not ctx.stream or upstream.status >= 400:
            # The engine's refusal is one JSON body, for a stream too.
            return await self.respond_whole(model, upstream, replica, ctx, first)
        return self.respond(model, upstream, replica, client_wants_usage, ctx, first)

    async def held(self, model: Model, reach: Awaitable[tuple[UpstreamResponse, Replica, bytes]],
                   client_wants_usage: bool, ctx: RequestContext, interval: float) -> Response:
        """A streamed request at a cold start: answered as usual if its first byte comes
        within ``interval``; else 200 now, with progress comments until it does
        (``activator.held``)."""
        task = asyncio.ensure_future(reach)
        try:
            await asyncio.wait((task,), timeout=interval)
        except BaseException:
            task.cancel()
            raise
        if task.done():
            return await self.answer(model, *task.result(), client_wants_usage, ctx)
        ctx.status = 200
        ctx.held = True
        headers = {**ctx.response_headers(), "cache-control": "no-cache"}
        return ProxyStream(self._held_chunks(model, task, client_wants_usage, ctx, interval), 200, headers,
                           "text/event-stream")

    async def _held_chunks(self, model: Model, task: asyncio.Future[tuple[UpstreamResponse, Replica, bytes]],
                           client_wants_usage: bool, ctx: RequestContext, interval: float) -> AsyncGenerator[bytes, None]:
        answer: AsyncGenerator[bytes, None] | None = None
        try:
            while not task.done():
                status = self.routes.status(model.name)
                yield progress_comment(held_phase(ctx.sent, status.loading), self.clock() - ctx.arrival,
                                       status.expected_cold_start_s)
                await asyncio.wait((task,), timeout=interval)
            try:
                upstream, replica, first = task.result()
            except ApiError as exc:
                ctx.status = exc.status
                await self.recorder.record(ctx, exc.code)
                log.info("request_refused", status=exc.status, code=exc.code, message=exc.message,
                         model=model.name, held=True)
                yield error_event(exc)
                return
            except Exception:  # our bug: said as the 500 a request not held would get
                log.exception("request_failed", held=True)
                ctx.status = 500
                await self.recorder.record(ctx, "internal_error")
                yield sse_error_event(json.dumps(internal_error_body(ctx.request_id)).encode())
                return
            # No yield until the answer owns the replica's slot and its connection: a
            # client gone at a yield before would leave both taken.
            if upstream.status >= 400:  # the engine's refusal: one JSON body, as an event
                whole = await self.respond_whole(model, upstream, replica, ctx, first)
                yield ready_comment(ctx) + sse_error_event(bytes(whole.body))
                return
            # The ready line goes out with the answer's first bytes (an SSE comment, which
            # the usage tap passes on as it is).
            answer = self.respond(model, upstream, replica, client_wants_usage, ctx, ready_comment(ctx) + first).chunks
            async for chunk in answer:
                yield chunk
        finally:
            if answer is not None:
                await answer.aclose()
            elif not task.done():  # the client left while held: nothing was sent upstream
                task.cancel()
                ctx.cancelled = True
                await self.recorder.record(ctx)

    async def send(
        self, model: Model, kind: Kind, body: dict[str, Any], acquired: Acquired, ctx: RequestContext,
        *, stream: bool = False,
    ) -> tuple[UpstreamResponse, Replica, bytes]:
        """Send upstream; a replica that fails before its first byte is dropped and another
        tried once. For a stream, the first chunk of the body is read here: a replica that
        sends its headers and dies before any of its body is a failure before the first
        byte too (retried), not a 200 the client would see cut short."""
        replica = acquired.replica
        for attempt in (1, 2):
            payload = json.dumps({**body, "model": replica.served_model_name}).encode()
            try:
                resp = await self.http.post(replica.url + UPSTREAM_PATH[kind], payload, upstream_headers(ctx),
                    read_timeout_s=self.cfg.server.upstream_stream_idle_s if stream else None)
                if not stream:
                    return resp, replica, b""
                try:
                    first = await resp.readany()
                except BaseException:
                    resp.close()
                    raise
                return resp, replica, first
            except BaseException as exc:
                # Whatever happened (a dead replica, a cancelled client), the slot is free.
                self.routes.release(model.name, replica)
                if not _retryable(exc, stream):
                    raise
                log.warning("upstream_failed_before_first_byte", url=replica.url, attempt=attempt, error=str(exc))
                self.metrics.upstream_retries.labels(model.name).inc()
                self.routes.eject(model.name, replica.url)
                if attempt == 2:
                    raise UpstreamError(
                        f"the replica for {model.resolved_served_name!r} failed before answering; retry",
                        retry_after_s=self.cfg.server.replica_ejection_s,  # when it is tried again
                    ) from None
                again = await self.routes.acquire(model, ctx.arrival, prefix_key(kind, body), ctx.tenant or "")
                ctx.cold = ctx.cold or again.cold
                ctx.queue_s = max(ctx.queue_s, again.queue_s)
                replica = again.replica
        raise AssertionError("unreachable")

    async def respond_whole(
        self, model: Model, upstream: UpstreamResponse, replica: Replica, ctx: RequestContext,
        first: bytes = b"",
    ) -> Response:
        """A whole answer (not streamed, or the engine's refusal of a stream): read it,
        take its usage, commit the record, answer. A refusal reaches the client in
        OpenAI's error shape, with the engine's status and message."""
        try:
            content = first + await upstream.read()
            self.recorder.first_byte(model, replica, ctx)
        except (ConnectionError, TimeoutError) as exc:
            ctx.status = 502
            raise UpstreamError(f"the replica failed while answering: {exc or type(exc).__name__}") from None
        finally:
            self.routes.ended(model.name, self.clock(), replica)
            upstream.release()
        ctx.status = upstream.status
        usage_from_body(content, ctx.usage)
        await self.recorder.record(ctx)
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        headers.update(ctx.response_headers())
        if upstream.status >= 400:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-encoding")}
            return Response(upstream_error_body(upstream.status, content), status_code=upstream.status,
                            headers=headers, media_type="application/json")
        return Response(content, status_code=upstream.status, headers=headers,
                        media_type=upstream.headers.get("content-type"))

    def respond(
        self, model: Model, upstream: UpstreamResponse, replica: Replica, client_wants_usage: bool,
        ctx: RequestContext, first: bytes = b"",
    ) -> ProxyStream:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        headers.update(ctx.response_headers())
        ctx.status = upstream.status
        tap = StreamTap(ctx.usage, forward_usage_chunk=client_wants_usage,
                        finish_reasons=ctx.trace is not None and (ctx.trace.sampled or ctx.cold))
        done = False

        async def finish() -> None:
            nonlocal done
            if done:
                return
            done = True
            self.routes.ended(model.name, self.clock(), replica)
            # A stream read to its end gives its connection back; one cut short closes it
            # (and vLLM aborts the request).
            if upstream.at_eof():
                upstream.release()
            else:
                upstream.close()
            if not ctx.recorded:
                # The client went away (or the stream broke) before the end.
                ctx.cancelled = not tap.saw_done
                await self.recorder.record(ctx)

        async def body_iter() -> AsyncGenerator[bytes, None]:
            chunk = first
            try:
                while chunk or not upstream.at_eof():
                    if not chunk:
                        chunk = await upstream.readany()
                        continue
                    if ctx.first_byte_at is None:
                        self.recorder.first_byte(model, replica, ctx)
                    # The events of one upstream read go out in one write.
                    out = bytearray()
                    for event in tap.feed(chunk):
                        if len(event) < 32 and event.strip() == DONE:
                            if out:
                                yield bytes(out)
                                out.clear()
                            # The guarantee: committed before the client sees the end.
                            await self.recorder.record(ctx)
                        out += event
                    if tap.saw_done and upstream.at_eof():
                        # The end (the replica's terminator came in during the commit):
                        # the replica is given back first, as before the end was sent.
                        out += tap.flush()
                        await finish()
                        yield FinalChunk(out)
                        return
                    if out:
                        yield bytes(out)
                    chunk = b""
                rest = tap.flush()
                if rest:
                    yield rest
            except (ConnectionError, TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
                log.warning("upstream_failed_mid_stream", url=replica.url, error=why)
                ctx.status = 502
                if ctx.first_byte_at is not None:
                    err = error_body(502, f"the replica failed mid-stream: {why}; the answer is incomplete",
                                     "server_error", None, "upstream_error")
                    await self.recorder.record(ctx, error_code="upstream_error")
                    yield sse_error_event(json.dumps(err).encode())
                else:
                    raise
            finally:
                await finish()

        return ProxyStream(body_iter(), upstream.status, headers, upstream.headers.get("content-type"))
