"""Serving one completion request: admission, a replica (hot or via the cold queue), the proxy.

The router in ``activator.app`` only hands the raw request here. Streams are passed
through byte for byte; a failure before the first byte is retried once on another
replica, a failure after it becomes an SSE error event followed by ``data: [DONE]``.
A client that disconnects closes the upstream request, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import Response

from activator.auth import Authenticator, Principal, check_model_access
from activator.bounds import RequestBounds, parse_json
from activator.context import RequestContext
from activator.edge import IncomingRequest, ProxyStream, client_address
from activator.errors import (
    ApiError,
    BadRequest,
    NotFound,
    PayloadTooLarge,
    TooManyFailedAuth,
    Unauthorized,
    UpstreamError,
    error_body,
    upstream_error_body,
)
from activator.ledger import Ledger
from activator.limits import Limiter, LocalLimiter
from activator.metrics import ActivatorMetrics
from activator.protocol import Kind, parse_request, tenant_cache_salt
from activator.recording import RequestRecorder
from activator.replica_choice import prefix_key
from activator.routing.replicas import Replica, cold_start_tier
from activator.routing.router import Acquired, Router, wakes
from activator.throttle import FailedAuthThrottle
from activator.tokens import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    INLINE_COUNT_CHARS,
    PromptRejected,
    TokenCounter,
    prompt_chars,
)
from activator.upstream import UpstreamPool, UpstreamResponse
from activator.usage import DONE, StreamTap, usage_from_body
from thaw.config import Model, ThawConfig
from thaw.log import get_logger

log = get_logger()

UPSTREAM_PATH: dict[Kind, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Headers from the engine that are about the connection, not the content.
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}


def upstream_client(timeout_s: float = 600.0) -> UpstreamPool:
    """The client the activator proxies to replicas with (``loadtests.http_overhead``
    measures it against aiohttp and httpx). A replica has ``timeout_s`` between two reads
    of its answer; bodies pass through as the engine sent them."""
    return UpstreamPool(connect_timeout_s=2.0, read_timeout_s=timeout_s)


def _retryable(exc: BaseException, stream: bool) -> bool:
    """A replica that failed before its first byte, such that another may answer: it
    refused or dropped the connection, or (a stream) sent nothing for the stream idle
    limit, which an engine that is merely busy does not reach. A whole answer that is
    slow is not retried: its replica is working on it."""
    if isinstance(exc, TimeoutError):
        return stream
    return isinstance(exc, ConnectionError)


class CompletionService:
    def __init__(
        self,
        cfg: ThawConfig,
        auth: Authenticator,
        routes: Router,
        metrics: ActivatorMetrics,
        ledger: Ledger,
        tokens: TokenCounter | None = None,
        *,
        clock: Callable[[], float] = time.time,
        limiter: Limiter | None = None,
        auth_throttle: FailedAuthThrottle | None = None,
    ) -> None:
        self.cfg = cfg
        self.auth = auth
        self.auth_throttle = auth_throttle or FailedAuthThrottle(cfg.server.failed_auth)
        self.bounds = RequestBounds.from_server(cfg.server)
        self.routes = routes
        self.metrics = metrics
        self.ledger = ledger
        self.tokens = tokens
        self.limiter: Limiter = limiter or LocalLimiter()
        self.clock = clock
        self._http = upstream_client(cfg.server.upstream_timeout_s)
        self.recorder = RequestRecorder(ledger, self.limiter, metrics, routes, clock)

    async def close(self) -> None:
        await self._http.close()

    def use_config(self, cfg: ThawConfig) -> None:
        """The models and tenants in force changed (the controller's catalog)."""
        self.cfg = cfg

    # -- admission ------------------------------------------------------------------
    def principal(self, request: IncomingRequest) -> Principal:
        """The caller, by its API key. Every key is checked; a failure counts against the
        client's address (``activator.throttle``): past its budget, 429 instead of 401."""
        try:
            return self.auth.authenticate(request.headers.get("authorization"))
        except Unauthorized as exc:
            refused = exc
        address = client_address(request)
        verdict = self.auth_throttle.failed(address)
        if not verdict.retry_after_s:
            self.metrics.auth_failures.labels("refused").inc()
            raise refused
        self.metrics.auth_failures.labels("throttled").inc()
        if verdict.newly_throttled:
            log.warning("auth_throttled", client=address, retry_after_s=round(verdict.retry_after_s, 1))
        raise TooManyFailedAuth("too many requests with a missing or invalid API key from this address",
                                retry_after_s=verdict.retry_after_s)

    def resolve_model(self, principal: Principal, requested: str) -> Model:
        model = self.cfg.model(requested)
        if model is None:
            raise NotFound(f"the model {requested!r} does not exist", param="model")
        check_model_access(principal, model.name, requested)
        return model

    def visible_model(self, principal: Principal, name: str) -> Model | None:
        """The model ``name`` names, if this tenant may use it (else as if none did)."""
        model = self.cfg.model(name)
        return model if model is not None and principal.may_use(model.name) else None

    async def read_json(self, request: IncomingRequest) -> dict[str, Any]:
        limit = self.cfg.server.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw:
            raise BadRequest("request body is empty; send a JSON object")
        body = parse_json(raw, self.bounds)  # depth and string lengths bounded: 400
        if not isinstance(body, dict):
            raise BadRequest(f"request body must be a JSON object, not {type(body).__name__}")
        return body

    # -- the request ----------------------------------------------------------------
    async def handle(self, request: IncomingRequest, kind: Kind, ctx: RequestContext,
                     path_model: str | None) -> Response:
        principal = self.principal(request)
        ctx.tenant = principal.tenant
        body = await self.read_json(request)
        requested = body.get("model")
        if path_model is not None:
            # Whether the two name one model is judged among the models this tenant may
            # use: the answer must not tell another tenant's model from a missing one.
            if (requested is not None and requested != path_model
                    and self.visible_model(principal, requested) is not self.visible_model(principal, path_model)):
                raise BadRequest(f"'model' is {requested!r} but the URL is for {path_model!r}", param="model")
            requested = path_model
        if not isinstance(requested, str) or not requested:
            raise BadRequest("'model' is required", param="model")
        model = self.resolve_model(principal, requested)
        ctx.model = model
        return await self.serve(principal, model, kind, body if "model" in body else {**body, "model": requested},
                                ctx)

    async def serve(self, principal: Principal, model: Model, kind: Kind, body: dict[str, Any],
                    ctx: RequestContext, *, affinity: str | None = None) -> Response:
        """One completion request of ``principal``'s for ``model`` (resolved; ``body`` names
        it): checked, admitted, routed (``affinity``: the key of the prefix it shares with
        earlier requests, else one taken from its opening), answered whole or streamed."""
        ctx.tenant, ctx.model = principal.tenant, model
        ctx.operation = "chat" if kind == "chat" else "text_completion"  # the GenAI conventions' names
        # Validated; the engine receives the client's body but for the served name, the
        # tenant's cache_salt and (streams) the usage chunk asked for.
        req = parse_request(kind, body)
        stream = ctx.stream = bool(req.stream)
        client_wants_usage = bool(req.stream_options and req.stream_options.include_usage) if stream else True
        if wakes(self.routes.replicas(model.name), self.clock()):  # it starts while this request is admitted
            self.routes.feed.signal_demand(model.name)
        await self.admit(principal.tenant, principal, model, kind, body, ctx)
        # The engine's prefix cache is shared by every request: salted per tenant, one
        # tenant's cached prompts cannot speed up (and so reveal themselves to) another's.
        body = {**body, "cache_salt": tenant_cache_salt(principal.tenant, req.cache_salt)}
        if stream:
            # Always get usage from the engine, for the ledger; the tap forwards the
            # usage chunk only when the client asked for it.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}

        ctx.cold = self.routes.arrive(model.name, self.clock())
        key = affinity or prefix_key(kind, body)
        try:
            acquired = await self.routes.acquire(model, ctx.arrival, key, ctx.tenant or "")
        finally:
            if ctx.cold:
                ctx.queue_s = self.clock() - ctx.arrival
        ctx.cold, ctx.queue_s = acquired.cold, acquired.queue_s
        if acquired.cold:
            ctx.enqueued_at = ctx.arrival  # demand is signalled as the request is queued
        self.routes.started(model.name)
        try:
            upstream, replica, first = await self._send(model, kind, body, acquired, ctx, stream=stream)
        except BaseException:
            self.routes.ended(model.name, self.clock())
            raise
        ctx.replica = replica.assignment_id or replica.worker_id
        ctx.revision = replica.revision
        ctx.tier = cold_start_tier(ctx.enqueued_at or ctx.arrival, replica) if ctx.cold else "hot"
        if not stream or upstream.status >= 400:
            # The engine's refusal is one JSON body, for a stream too.
            return await self._respond_whole(model, upstream, replica, ctx, first)
        return self._respond(model, upstream, replica, client_wants_usage, ctx, first)

    async def admit(self, tenant: str, principal: Principal, model: Model, kind: Kind, body: dict[str, Any],
                    ctx: RequestContext) -> None:
        """Context length with the model's tokenizer, then the tenant's rate limits."""
        lengths = await self.check_context(model, kind, body)
        prompt_tokens = max(lengths) if lengths else None
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        n = body.get("n") or 1
        estimate = sum(lengths) if lengths else len(json.dumps(body)) // 4
        sequences = n * (len(lengths) if lengths else 1)
        # Without max_tokens the engine generates up to the context (chat) or its
        # completions default: reserve that.
        default_new = (max(model.max_context_tokens - (prompt_tokens or estimate), 0) if kind == "chat"
                       else COMPLETIONS_DEFAULT_MAX_TOKENS)
        reserve = estimate + sequences * (max_new or default_new)
        ctx.admission = await self.limiter.admit(tenant, model.name, principal.limits, reserve, self.clock())
        ctx.rate_headers = ctx.admission.headers

    async def check_context(self, model: Model, kind: Kind, body: dict[str, Any]) -> list[int] | None:
        """Each prompt's tokens, counted with the model's tokenizer (None: no tokenizer);
        BadRequest when the longest and what it may generate exceed the context, or the
        chat template refuses the messages."""
        # An adapter's prompts are its base's tokens (the adapter ships no tokenizer).
        counter = await self.tokens.get(self.cfg.engine_model(model).uri) if self.tokens else None
        lengths: list[int] | None = None
        if counter is not None:
            try:
                if prompt_chars(kind, body) < INLINE_COUNT_CHARS:
                    lengths = counter.prompt_lengths(kind, body, max_model_len=model.max_context_tokens)
                else:  # milliseconds of rendering and encoding: not on the loop every stream shares
                    lengths = await asyncio.to_thread(counter.prompt_lengths, kind, body,
                                                      max_model_len=model.max_context_tokens)
            except PromptRejected as exc:  # the template refuses these messages, as it would in the engine
                raise BadRequest(f"the messages do not fit the model's chat template: {exc}",
                                 param="messages") from None
            except Exception as exc:  # our bug, not the client's: the engine will count
                log.warning("prompt_count_failed", model=model.name, error=repr(exc))
        # Each prompt of a batch is its own sequence in the engine: the longest must fit.
        prompt_tokens = max(lengths) if lengths else None
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        if prompt_tokens is not None:
            limit = model.max_context_tokens
            if prompt_tokens + (max_new or 0) > limit:
                what = f"{prompt_tokens} in the prompt" + (f" + {max_new} to generate" if max_new else "")
                raise BadRequest(
                    f"this model's maximum context length is {limit} tokens; the request needs {what}",
                    param="max_tokens" if max_new and prompt_tokens < limit else
                    ("messages" if kind == "chat" else "prompt"),
                    code="context_length_exceeded",
                )
        return lengths

    async def run_batch_line(self, tenant: str, model: Model, kind: Kind, body: dict[str, Any], replica: Replica,
                             ctx: RequestContext) -> tuple[int, bytes]:
        """One line of a batch on ``replica`` (a slot the batch worker holds and frees),
        answered whole: the status and body a client would have had (an error in
        OpenAI's shape). Checked as an online request is, but for rate limits (a batch
        runs on room online traffic leaves). Not recorded here: the worker records
        ``ctx`` (``service_tier`` batch) once the controller kept the answer, so a line
        run twice is billed once.
        Raises what the upstream raises, and UpstreamError for a 5xx answer (the worker
        gives the line back, as failed)."""
        ctx.tenant, ctx.model, ctx.service_tier = tenant, model, "batch"
        try:
            req = parse_request(kind, body)
            await self.check_context(model, kind, body)
        except ApiError as exc:
            ctx.status = exc.status
            return exc.status, json.dumps(error_body(exc.status, exc.message, exc.type, exc.param,
                                                     exc.code)).encode()
        payload = {**body, "stream": False, "model": replica.served_model_name,
                   "cache_salt": tenant_cache_salt(tenant, req.cache_salt)}
        upstream = await self._http.post(replica.url + UPSTREAM_PATH[kind], json.dumps(payload).encode(), {
            "x-request-id": ctx.request_id, "content-type": "application/json"})
        try:
            content = await upstream.read()
        finally:
            upstream.release()
        ctx.first_byte_at = self.clock()
        ctx.status, ctx.revision = upstream.status, replica.revision
        ctx.replica = replica.assignment_id or replica.worker_id
        usage_from_body(content, ctx.usage)
        if upstream.status >= 500:
            # The replica failed (an engine dying answers 500 before its server goes):
            # no answer for the line, which runs again.
            raise UpstreamError(f"the replica answered {upstream.status}: {content[:300].decode('utf-8', 'replace')}")
        return upstream.status, upstream_error_body(upstream.status, content) if upstream.status >= 400 else content

    async def _send(
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
                resp = await self._http.post(replica.url + UPSTREAM_PATH[kind], payload, {
                    "x-request-id": ctx.request_id, "content-type": "application/json"},
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

    async def _respond_whole(
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
        await self.record(ctx)
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        headers.update(ctx.response_headers())
        if upstream.status >= 400:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-encoding")}
            return Response(upstream_error_body(upstream.status, content), status_code=upstream.status,
                            headers=headers, media_type="application/json")
        return Response(content, status_code=upstream.status, headers=headers,
                        media_type=upstream.headers.get("content-type"))

    def _respond(
        self, model: Model, upstream: UpstreamResponse, replica: Replica, client_wants_usage: bool,
        ctx: RequestContext, first: bytes = b"",
    ) -> Response:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        headers.update(ctx.response_headers())
        ctx.status = upstream.status
        tap = StreamTap(ctx.usage, forward_usage_chunk=client_wants_usage)
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
                await self.record(ctx)

        async def body_iter() -> AsyncIterator[bytes]:
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
                            await self.record(ctx)
                        out += event
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
                    await self.record(ctx, error_code="upstream_error")
                    yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
                else:
                    raise
            finally:
                await finish()

        return ProxyStream(body_iter(), upstream.status, headers, upstream.headers.get("content-type"))

    async def record(self, ctx: RequestContext, error_code: str | None = None) -> None:
        """Append this request's usage record once (no-op before authentication)."""
        await self.recorder.record(ctx, error_code)

    def observe_end(self, ctx: RequestContext, error: ApiError | None = None) -> None:
        label = ctx.model.name if ctx.model else "unknown"
        self.metrics.requests.labels(label, str(error.status if error else ctx.status)).inc()

