"""Serving one completion request: admission, a replica (hot or via the cold queue), and
the answer handed to ``activator.answer``, which sends the request and proxies what
comes back.

The router in ``activator.app`` only hands the raw request here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from fastapi.responses import Response

from activator.answer import UPSTREAM_PATH, Answers, upstream_headers
from activator.auth import Authenticator, Principal, check_model_access
from activator.bounds import RequestBounds, parse_json
from activator.context import RequestContext
from activator.edge import IncomingRequest, client_address
from activator.errors import (
    ApiError,
    BadRequest,
    NotFound,
    PayloadTooLarge,
    TooManyFailedAuth,
    TooManyRequests,
    Unauthorized,
    UpstreamError,
    error_body,
    upstream_error_body,
)
from activator.ledger import Ledger
from activator.limits import Limiter, LocalLimiter
from activator.metrics import ActivatorMetrics
from activator.protocol import Kind, max_new_tokens, parse_request, tenant_cache_salt
from activator.recording import RequestRecorder
from activator.replica_choice import prefix_key
from activator.routing.replicas import Replica, cold_start_tier
from activator.routing.router import Router, wakes
from activator.throttle import FailedAuthThrottle
from activator.token_bound import fits, reservation
from activator.tokens import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    INLINE_COUNT_CHARS,
    ModelTokenizer,
    PromptRejected,
    TokenCounter,
    prompt_chars,
)
from activator.upstream import UpstreamPool, UpstreamResponse
from activator.usage import usage_from_body
from thaw.config import Model, ThawConfig
from thaw.log import get_logger
from thaw.telemetry import Tracing

log = get_logger()

# Refusals by the tenant's token budget: with the bound's reservation, the exact one may fit.
_TOKEN_REFUSALS = ("tokens_exceeded", "rate_limit_tokens")


def upstream_client(timeout_s: float = 600.0) -> UpstreamPool:
    """The client the activator proxies to replicas with (``loadtests.http_overhead``
    measures it against aiohttp and httpx). A replica has ``timeout_s`` between two reads
    of its answer; bodies pass through as the engine sent them."""
    return UpstreamPool(connect_timeout_s=2.0, read_timeout_s=timeout_s)


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
        tracing: Tracing | None = None,
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
        self.recorder = RequestRecorder(ledger, self.limiter, metrics, routes, clock, tracing)
        self.answers = Answers(cfg, routes, metrics, self.recorder, upstream_client(cfg.server.upstream_timeout_s),
                               clock)

    @property
    def tracing(self) -> Tracing | None:
        """This activator's tracing (None: off), its recorder's."""
        return self.recorder.tracing

    async def close(self) -> None:
        await self.answers.http.close()

    def use_config(self, cfg: ThawConfig) -> None:
        """The models and tenants in force changed (the controller's catalog)."""
        self.cfg = self.answers.cfg = cfg

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
                                ctx, progress=True)

    async def serve(self, principal: Principal, model: Model, kind: Kind, body: dict[str, Any],
                    ctx: RequestContext, *, affinity: str | None = None, progress: bool = False) -> Response:
        """One completion request of ``principal``'s for ``model`` (resolved; ``body`` names
        it): checked, admitted, routed (``affinity``: the key of the prefix it shares with
        earlier requests, else one taken from its opening), answered whole or streamed
        (``progress``: a stream held for a cold start is sent comments while it waits)."""
        ctx.tenant, ctx.model = principal.tenant, model
        ctx.operation = "chat" if kind == "chat" else "text_completion"  # the GenAI conventions' names
        # Validated; the engine receives the client's body but for the served name, the
        # tenant's cache_salt and (streams) the usage chunk asked for.
        req = parse_request(kind, body)
        stream = ctx.stream = bool(req.stream)
        client_wants_usage = bool(req.stream_options and req.stream_options.include_usage) if stream else True
        if wakes(self.routes.replicas(model.name), self.clock()):  # it starts while this request is admitted
            if ctx.trace is not None:  # a cold start is always traced, here and downstream
                ctx.trace = ctx.trace.kept()
            self.routes.feed.signal_demand(model.name, ctx.trace)
        # A model without a ready replica is counted exactly: a prompt its template
        # refuses is refused here, and a count costs nothing beside a cold start.
        await self.admit(principal.tenant, principal, model, kind, body, ctx,
                         exact=not self.routes.replicas(model.name).usable)
        # The engine's prefix cache is shared by every request: salted per tenant, one
        # tenant's cached prompts cannot speed up (and so reveal themselves to) another's.
        body = {**body, "cache_salt": tenant_cache_salt(principal.tenant, req.cache_salt)}
        if stream:
            # Always get usage from the engine, for the ledger; the tap forwards the
            # usage chunk only when the client asked for it.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}

        ctx.cold = self.routes.arrive(model.name, self.clock())
        reach = self._reach(model, kind, body, affinity or prefix_key(kind, body), ctx, stream=stream)
        interval = self.cfg.server.held_progress_interval_s
        if stream and ctx.cold and progress and interval > 0:
            return await self.answers.held(model, reach, client_wants_usage, ctx, interval)
        upstream, replica, first = await reach
        return await self.answers.answer(model, upstream, replica, first, client_wants_usage, ctx)

    async def _reach(self, model: Model, kind: Kind, body: dict[str, Any], key: str | None, ctx: RequestContext,
                     *, stream: bool) -> tuple[UpstreamResponse, Replica, bytes]:
        """A replica (hot, or after a cold start), the request sent to it and (a stream)
        the first chunk of its answer read."""
        try:
            acquired = await self.routes.acquire(model, ctx.arrival, key, ctx.tenant or "")
        finally:
            if ctx.cold:
                ctx.queue_s = self.clock() - ctx.arrival
        ctx.cold, ctx.queue_s = acquired.cold, acquired.queue_s
        if acquired.cold:
            ctx.enqueued_at = ctx.arrival  # demand is signalled as the request is queued
        self.routes.started(model.name)
        ctx.sent = True
        try:
            upstream, replica, first = await self.answers.send(model, kind, body, acquired, ctx, stream=stream)
        except BaseException:
            self.routes.ended(model.name, self.clock())
            raise
        ctx.replica = replica.assignment_id or replica.worker_id
        ctx.revision = replica.revision
        ctx.tier = cold_start_tier(ctx.enqueued_at or ctx.arrival, replica) if ctx.cold else "hot"
        return upstream, replica, first

    async def admit(self, tenant: str, principal: Principal, model: Model, kind: Kind, body: dict[str, Any],
                    ctx: RequestContext, *, exact: bool = False) -> None:
        """Context length with the model's tokenizer, then the tenant's rate limits.

        The prompt is bounded from its bytes (``activator.token_bound``) and counted
        exactly only where the bound cannot decide: the bound and what the request may
        generate may not fit the context, the tenant's token budget refuses the bound's
        reservation (it may hold the exact one), or ``exact`` (the model has no ready
        replica: a count is nothing beside a cold start). ``ctx.counted`` says which."""
        counter = await self._tokenizer(model)
        max_new = max_new_tokens(body)
        bounds = None if exact or counter is None else counter.prompt_bounds(kind, body)
        lengths: list[int] | None = None
        if bounds is not None and not fits(bounds, max_new, model.max_context_tokens):
            bounds = None
        try:
            if bounds is None:
                ctx.counted = counter is not None
                lengths = await self.check_context(model, kind, body)
            try:
                ctx.admission = await self.limiter.admit(
                    tenant, model.name, principal.limits,
                    self._reserve(model, kind, body, bounds or lengths, upper=bounds is not None), self.clock())
            except TooManyRequests as exc:
                if bounds is None or exc.code not in _TOKEN_REFUSALS:
                    raise
                # The bound's reservation is more than the exact one: refused by the
                # tenant's token budget, the request is counted and asks again.
                ctx.counted = True
                lengths = await self.check_context(model, kind, body)
                ctx.admission = await self.limiter.admit(tenant, model.name, principal.limits,
                                                         self._reserve(model, kind, body, lengths), self.clock())
        finally:
            if counter is not None:
                self.metrics.prompt_counts.labels("exact" if ctx.counted else "bound").inc()
        ctx.rate_headers = ctx.admission.headers

    @staticmethod
    def _reserve(model: Model, kind: Kind, body: dict[str, Any], prompts: list[int] | None, *,
                 upper: bool = False) -> int:
        """The tokens a request reserves of its tenant's budget, from its prompts' counts
        (``upper``: their bounds), or an estimate from its size when it has none."""
        max_new = max_new_tokens(body)
        n = body.get("n") or 1
        if prompts:
            return reservation(kind, prompts, max_new, n, model.max_context_tokens, upper=upper,
                               completions_default=COMPLETIONS_DEFAULT_MAX_TOKENS)
        estimate = len(json.dumps(body)) // 4
        # Without max_tokens the engine generates up to the context (chat) or its
        # completions default: reserve that.
        default_new = (max(model.max_context_tokens - estimate, 0) if kind == "chat"
                       else COMPLETIONS_DEFAULT_MAX_TOKENS)
        return estimate + n * (max_new or default_new)

    async def _tokenizer(self, model: Model) -> ModelTokenizer | None:
        # An adapter's prompts are its base's tokens (the adapter ships no tokenizer).
        return await self.tokens.get(self.cfg.engine_model(model).uri) if self.tokens else None

    async def check_context(self, model: Model, kind: Kind, body: dict[str, Any]) -> list[int] | None:
        """Each prompt's tokens, counted with the model's tokenizer (None: no tokenizer);
        BadRequest when the longest and what it may generate exceed the context, or the
        chat template refuses the messages."""
        counter = await self._tokenizer(model)
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
        max_new = max_new_tokens(body)
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
        upstream = await self.answers.http.post(replica.url + UPSTREAM_PATH[kind], json.dumps(payload).encode(),
                                                upstream_headers(ctx))
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

    async def record(self, ctx: RequestContext, error_code: str | None = None) -> None:
        """Append this request's usage record once (no-op before authentication)."""
        await self.recorder.record(ctx, error_code)

    def observe_end(self, ctx: RequestContext, error: ApiError | None = None) -> None:
        label = ctx.model.name if ctx.model else "unknown"
        self.metrics.requests.labels(label, str(error.status if error else ctx.status)).inc()

