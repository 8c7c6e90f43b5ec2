"""OpenAI's Responses API on the activator: ``POST /v1/responses`` (streamed or not),
``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``, per tenant.

A request is rendered into a chat completion (``activator.conversations.items``): the
stored history of ``previous_response_id`` (its chain's inputs and outputs, oldest
first), then ``instructions`` as the system message, then the new input items; it is
then served exactly as a chat completion is (checked, admitted, routed, billed), with
the conversation's first response id as its routing key, so each turn of one
conversation goes to the replica that holds its prefix while that replica is live and
under its load bound. With ``truncation: "auto"`` the oldest items are dropped until
the prompt fits the context, and the response says how many
(``thaw.truncated_items``); ``disabled``, the default: 400 ``context_length_exceeded``.

A stored response (``store``, default true) is written at the controller
(``warm_pool.conversations.store``) before its client sees the end of it: the whole body,
or ``response.completed``. If it cannot be written, the client gets an error instead
(503 ``responses_unavailable``, or an ``error`` event), never an id it cannot continue
from. Another tenant's response id is 404 ``No response found``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from activator.context import RequestContext
from activator.conversations.items import (
    ItemError,
    StreamTranslator,
    chat_messages,
    chat_tool_choice,
    chat_tools,
    input_items,
    new_id,
    output_items,
    output_text,
    response_usage,
    sse,
)
from activator.edge import ProxyStream
from activator.errors import ApiError, BadRequest, NotFound, ServiceUnavailable
from activator.service import CompletionService
from thaw.controllers import ControllerClient
from thaw.log import get_logger
from thaw.wire import (
    CONVERSATION_ID,
    RESPONSE_ID,
    ItemPage,
    ResponseObject,
    StoredItem,
    StoredResponse,
)

log = get_logger()


class ConversationRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(pattern=f"^{CONVERSATION_ID}$")]


class ResponsesRequest(BaseModel):
    """The fields of ``POST /v1/responses`` served here (any other is refused)."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1)]
    input: str | list[Any] | None = None  # optional, as OpenAI's: a conversation's items may be the input
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(pattern=f"^{RESPONSE_ID}$")] | None = None
    conversation: Annotated[str, Field(pattern=f"^{CONVERSATION_ID}$")] | ConversationRef | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: str | None = None


# /openapi.json's body of POST /v1/responses (the route reads the raw body itself).
CREATE_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {**ResponsesRequest.model_json_schema(), "additionalProperties": False}}}}}


class ResponsesApi:
    def __init__(self, service: CompletionService, controller: ControllerClient,
                 clock: Callable[[], float] = time.time) -> None:
        self.service = service
        self.controller = controller
        self.clock = clock

    # -- the controller's store ------------------------------------------------------

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self.controller.answer(method, path, **kw)
        if r is None:
            raise ServiceUnavailable("stored responses are unavailable: the controller cannot be reached",
                                     code="responses_unavailable", retry_after_s=5)
        return r

    async def get(self, tenant: str, response_id: str) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/stored-responses/{_safe(response_id)}", params={"tenant": tenant})
        if r.status_code == 404:
            raise _not_found(response_id)
        return r.json()  # type: ignore[no-any-return]

    async def delete(self, tenant: str, response_id: str) -> dict[str, Any]:
        r = await self._call("DELETE", f"/v1/stored-responses/{_safe(response_id)}", params={"tenant": tenant})
        if r.status_code == 404:
            raise _not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def input_items(self, tenant: str, response_id: str, *, after: str | None, limit: int,
                          order: Literal["asc", "desc"]) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/stored-responses/{_safe(response_id)}/input_items",
                             params={"tenant": tenant})
        if r.status_code == 404:
            raise _not_found(response_id)
        items = ItemPage.model_validate_json(r.content).items
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [i.get("id") for i in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

    async def _history(self, tenant: str, response_id: str) -> ItemPage:
        r = await self._call("GET", f"/v1/stored-responses/{_safe(response_id)}/history", params={"tenant": tenant})
        if r.status_code == 404:
            raise BadRequest(f"Previous response with id '{response_id}' not found.", param="previous_response_id",
                             code="previous_response_not_found")
        if r.status_code == 409:
            raise BadRequest(r.json().get("error", "the conversation is too long"), param="previous_response_id")
        return ItemPage.model_validate_json(r.content)

    async def _conversation(self, tenant: str, conversation_id: str) -> ItemPage:
        r = await self._call("GET", f"/v1/stored-conversations/{conversation_id}/items",
                             params={"tenant": tenant, "order": "asc"})
        if r.status_code == 404:
            raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                           code="not_found")
        return ItemPage.model_validate_json(r.content)

    async def _store(self, tenant: str, body: dict[str, Any], items: list[dict[str, Any]],
                     replica: str | None, conversation: str | None) -> bool:
        record = StoredResponse(tenant=tenant, response=ResponseObject.model_validate(body),
                                input_items=[StoredItem.model_validate(i) for i in items], replica=replica,
                                conversation=conversation)
        r = await self.controller.post_json("/v1/stored-responses", record.model_dump_json())
        return r is not None and r.status_code == 201

    # -- a new response ----------------------------------------------------------------

    async def create(self, request: Request, ctx: RequestContext) -> Response:
        service = self.service
        principal = service.principal(request)
        ctx.tenant = principal.tenant
        raw = await service.read_json(request)
        try:
            req = ResponsesRequest.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            if first["type"] == "extra_forbidden":
                raise BadRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter") from None
            raise BadRequest(f"{param}: {first['msg']}", param=param) from None
        model = service.resolve_model(principal, req.model)
        ctx.model = model
        try:
            items = input_items(req.input) if req.input is not None else []
            tools, tool_choice = chat_tools(req.tools), chat_tool_choice(req.tool_choice)
        except ItemError as exc:
            raise BadRequest(str(exc), param=exc.param) from None
        conversation = req.conversation.id if isinstance(req.conversation, ConversationRef) else req.conversation
        if conversation is not None and req.previous_response_id is not None:
            raise BadRequest("give 'conversation' or 'previous_response_id', not both", param="conversation")
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            history = (await self._history(principal.tenant, req.previous_response_id)).items
        elif conversation is not None:
            history = (await self._conversation(principal.tenant, conversation)).items
        if not history and not items:
            raise BadRequest("Missing required parameter: 'input' (there is no history to continue).",
                             param="input", code="missing_required_parameter")
        # The conversation's key for routing: its first item, the same in every turn.
        opening = (history or items)[0].get("id") or ""
        affinity = hashlib.blake2b(f"{principal.tenant}|{opening}".encode(), digest_size=8).hexdigest()
        chat: dict[str, Any] = {"model": req.model, "stream": req.stream}
        for name, value in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                            ("top_p", req.top_p), ("tools", tools), ("tool_choice", tool_choice),
                            ("parallel_tool_calls", req.parallel_tool_calls), ("user", req.user)):
            if value is not None:
                chat[name] = value
        if req.stream:
            chat["stream_options"] = {"include_usage": True}
        context, dropped = await self._fit(req, model, history + items, chat)
        chat["messages"] = chat_messages(req.instructions, context)
        base = {
            "id": new_id("resp"), "object": "response", "created_at": int(self.clock()), "status": "in_progress",
            "model": req.model, "output": [], "instructions": req.instructions,
            "previous_response_id": req.previous_response_id, "store": req.store,
            "conversation": {"id": conversation} if conversation else None,
            "max_output_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "tools": req.tools or [], "tool_choice": req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
            "truncation": req.truncation, "metadata": req.metadata or {}, "user": req.user, "usage": None,
            "error": None, "incomplete_details": None, "text": {"format": {"type": "text"}},
        }
        if dropped:
            # Said in the response (OpenAI's shape has no field for it: Thaw's own key).
            base["thaw"] = {"truncated_items": dropped}
            log.info("responses_truncated", dropped_items=dropped, model=model.name)
        answer = await service.serve(principal, model, "chat", chat, ctx, affinity=affinity)
        if answer.status_code >= 400:
            return answer  # the engine's (or our) refusal, in OpenAI's error shape
        # A turn of a conversation is added to it whatever ``store`` says (as OpenAI).
        keep = Keep(principal.tenant, items, conversation, req.store or conversation is not None)
        if isinstance(answer, ProxyStream):
            return self._stream(answer, base, keep, ctx)
        return await self._whole(answer, base, keep, ctx)

    async def _fit(self, req: ResponsesRequest, model: Any, context: list[dict[str, Any]],
                   chat: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
        """The items that fit the context: all of them (``disabled``: else the check's
        400), or (``auto``) the newest that fit, the oldest dropped; how many dropped."""
        dropped = 0
        while True:
            probe = {**chat, "messages": chat_messages(req.instructions, context)}
            try:
                await self.service.check_context(model, "chat", probe)
                return context, dropped
            except ApiError as exc:
                if req.truncation != "auto" or exc.code != "context_length_exceeded" or len(context) <= 1:
                    if exc.param == "messages":  # the caller sent input items, not messages
                        exc.param = "input"
                    raise
                context, dropped = context[1:], dropped + 1

    def _finished(self, base: dict[str, Any], items: list[dict[str, Any]], usage: dict[str, Any] | None,
                  finish_reason: str | None) -> dict[str, Any]:
        incomplete = finish_reason == "length"
        return {**base, "status": "incomplete" if incomplete else "completed", "output": items,
                "output_text": output_text(items), "usage": usage, "completed_at": int(self.clock()),
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None}

    async def _keep(self, keep: Keep, body: dict[str, Any], ctx: RequestContext) -> bool:
        return not keep.store or await self._store(keep.tenant, _stored(body), keep.items, ctx.replica,
                                                   keep.conversation)

    async def _whole(self, answer: Response, base: dict[str, Any], keep: Keep, ctx: RequestContext) -> Response:
        chat = json.loads(bytes(answer.body))
        choice = (chat.get("choices") or [{}])[0]
        finish = choice.get("finish_reason")
        body = self._finished(base, output_items(choice.get("message") or {}, finish_reason=finish),
                              response_usage(chat.get("usage")), finish)
        if not await self._keep(keep, body, ctx):
            raise ServiceUnavailable("the response could not be stored; nothing was kept, try again",
                                     code="responses_unavailable", retry_after_s=5)
        headers = {k: v for k, v in answer.headers.items() if k.lower().startswith(("x-", "openai-"))}
        return JSONResponse(body, headers=headers)

    def _stream(self, answer: ProxyStream, base: dict[str, Any], keep: Keep, ctx: RequestContext) -> ProxyStream:
        t = StreamTranslator()

        async def events() -> AsyncGenerator[bytes, None]:
            chunks = answer.chunks
            pending = b""
            try:
                yield b"".join(sse(e) for e in t.start(base))
                async for chunk in chunks:
                    pending += chunk
                    *whole, pending = pending.split(b"\n\n")
                    out = bytearray()
                    for event in whole:
                        line = event.strip()
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        if "error" in data:
                            err = data["error"]
                            out += sse(t.error(err.get("code") or "upstream_error", err.get("message", "")))
                            yield bytes(out)
                            return
                        out += b"".join(sse(e) for e in t.feed(data))
                    if out:
                        yield bytes(out)
                closing, output = t.finish()
                body = self._finished(base, output, response_usage(t.usage), t.finish_reason)
                if not await self._keep(keep, body, ctx):
                    yield sse(t.error("responses_unavailable", "the response could not be stored; nothing was "
                                      "kept, try again"))
                    return
                yield b"".join(sse(e) for e in closing) + sse(t.completed(body))
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]

        headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-type")}
        return ProxyStream(events(), 200, headers, "text/event-stream")


@dataclass(frozen=True)
class Keep:
    """What is kept of a turn once answered: its input items, for ``tenant``, in
    ``conversation`` if any; nothing unless ``store``."""

    tenant: str
    items: list[dict[str, Any]]
    conversation: str | None
    store: bool


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """What is kept of a response: all of it but the convenience ``output_text``."""
    return {k: v for k, v in body.items() if k != "output_text"}


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", code="not_found")


def _safe(response_id: str) -> str:
    """An id as a path segment (ids are resp_ + alphanumerics: anything else is not found)."""
    if not response_id.replace("_", "").isalnum() or len(response_id) > 100:
        raise _not_found(response_id)
    return response_id

