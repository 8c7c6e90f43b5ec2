"""The request bodies of the completion endpoints, in the style of vLLM's ``protocol.py``.

The models validate only what the activator itself acts on: ``model`` (routing),
``stream`` and ``stream_options`` (the proxy and the ledger), the shape of
``messages`` / ``prompt`` (the prompt count), ``max_tokens`` /
``max_completion_tokens`` and ``n`` (the context check and the rate-limit
reservation), ``cache_salt`` (replaced by one of the tenant's: ``tenant_cache_salt``).
Every other field is left as the client sent it (``extra="allow"``) and forwarded:
the engine answers for what it supports.

A field is refused here only where OpenAI's API would refuse it too: a name in
neither OpenAI's documented fields nor vLLM's extras gets 400
``unsupported_parameter`` naming it (OpenAI: "Unrecognized request argument
supplied: X").
"""

from __future__ import annotations

import copy
import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from activator.errors import BadRequest

Kind = Literal["chat", "completions"]

# Every field of OpenAI's request bodies, as its API reference documents them
# (deprecated ones included: clients still send them). Read from the OpenAPI spec
# behind the reference, github.com/openai/openai-openapi, `openapi.json` at commit
# f85dbe223d40e1a31cba812ab2d755c7e98a92a3 (spec version 2.3.0):
# components.schemas.CreateChatCompletionRequest (allOf CreateModelResponseProperties,
# itself allOf ModelResponseProperties, plus its own properties) and
# components.schemas.CreateCompletionRequest.
OPENAI_CHAT_FIELDS = frozenset({
    # ModelResponseProperties
    "metadata", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "temperature",
    "top_logprobs", "top_p", "user",
    # CreateModelResponseProperties
    "prompt_cache_options",
    # CreateChatCompletionRequest
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "messages", "modalities", "model", "moderation", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "reasoning_effort", "response_format",
    "seed", "service_tier", "stop", "store", "stream", "stream_options", "tool_choice", "tools",
    "verbosity", "web_search_options",
})
OPENAI_COMPLETIONS_FIELDS = frozenset({
    "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n",
    "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix",
    "temperature", "top_p", "user",
})

# The fields vLLM 0.32's OpenAI server declares beyond OpenAI's (its sampling and
# template extras): the field names of
# vllm.entrypoints.openai.chat_completion.protocol.ChatCompletionRequest and
# vllm.entrypoints.openai.completion.protocol.CompletionRequest, less OpenAI's.
VLLM_CHAT_FIELDS = frozenset({
    "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt",
    "chat_template", "chat_template_kwargs", "continue_final_message", "documents",
    "ec_transfer_params", "echo", "ignore_eos", "include_reasoning", "include_stop_str_in_output",
    "kv_transfer_params", "length_penalty", "logprob_token_ids", "media_io_kwargs", "min_p",
    "min_tokens", "mm_payload", "mm_processor_kwargs", "priority", "prompt_logprobs",
    "repetition_detection", "repetition_penalty", "request_id", "return_mm_kwargs",
    "return_prompt_text", "return_token_ids", "return_token_offsets", "return_tokens_as_token_ids",
    "routed_experts_prompt_start", "session_id", "skip_special_tokens",
    "spaces_between_special_tokens", "stop_token_ids", "stream_interval", "structured_outputs",
    "thinking_token_budget", "top_k", "truncate_prompt_tokens", "truncation_side", "use_beam_search",
    "vllm_xargs", "watermarking",
})
VLLM_COMPLETIONS_FIELDS = frozenset({
    "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "ec_transfer_params",
    "ignore_eos", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
    "logprob_token_ids", "min_p", "min_tokens", "mm_payload", "priority", "prompt_embeds",
    "prompt_logprobs", "repetition_detection", "repetition_penalty", "request_id", "response_format",
    "return_mm_kwargs", "return_token_ids", "return_token_offsets", "return_tokens_as_token_ids",
    "routed_experts_prompt_start", "session_id", "skip_special_tokens",
    "spaces_between_special_tokens", "stop_token_ids", "stream_interval", "structured_outputs",
    "thinking_token_budget", "top_k", "truncate_prompt_tokens", "truncation_side", "use_beam_search",
    "vllm_xargs", "watermarking",
})
KNOWN_FIELDS: dict[Kind, frozenset[str]] = {
    "chat": OPENAI_CHAT_FIELDS | VLLM_CHAT_FIELDS,
    "completions": OPENAI_COMPLETIONS_FIELDS | VLLM_COMPLETIONS_FIELDS,
}

# Strict types: a bool is not a count, "3" is not 3.
PositiveCount = Annotated[StrictInt, Field(gt=0)]
TokenId = Annotated[StrictInt, Field(ge=0)]


class OpenAIBaseModel(BaseModel):
    # As vLLM's: OpenAI's API has more fields than any one server models.
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBaseModel):
    include_usage: StrictBool | None = Field(
        None, description="Send a final chunk with the request's token usage before `data: [DONE]`.")


class ChatMessage(OpenAIBaseModel):
    role: StrictStr = Field(description="system, developer, user, assistant or tool.")


class _CompletionBase(OpenAIBaseModel):
    model: Annotated[StrictStr, Field(min_length=1)] = Field(
        description="The model's name as `/v1/models` lists it.")
    stream: StrictBool | None = Field(None, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = None
    n: PositiveCount | None = Field(None, description="How many choices to generate.")
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=1024)] | None = Field(
        None, description="Divides the caller's own share of the engine's prefix cache further. "
        "Whatever is sent, the engine receives a salt derived from it and the caller's tenant "
        "(`tenant_cache_salt`).")


class ChatCompletionRequest(_CompletionBase):
    """POST /v1/chat/completions: what the activator checks; every other known field
    is forwarded as sent."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveCount | None = None
    max_tokens: PositiveCount | None = Field(None, description="Deprecated by OpenAI for "
                                             "`max_completion_tokens`; still accepted.")


class CompletionRequest(_CompletionBase):
    """POST /v1/completions: what the activator checks; every other known field is
    forwarded as sent."""

    prompt: (Annotated[StrictStr, Field(min_length=1)]
             | Annotated[list[StrictStr], Field(min_length=1)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)])
    max_tokens: PositiveCount | None = None


REQUEST_MODELS: dict[Kind, type[_CompletionBase]] = {
    "chat": ChatCompletionRequest, "completions": CompletionRequest,
}

# What each validated field must be, for the client's error message.
_EXPECTED = {
    "model": "a non-empty string",
    "messages": "a non-empty array of messages",
    "prompt": "a non-empty string, array of strings, array of token ids or array of token-id arrays",
    "stream": "a boolean",
    "stream_options": "an object whose 'include_usage' is a boolean",
    "n": "a positive integer",
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "cache_salt": "a non-empty string of at most 1024 characters",
}


def max_new_tokens(body: dict[str, Any]) -> int | None:
    """What a request may generate per sequence, as it says: ``max_completion_tokens``,
    else ``max_tokens`` (None: neither, the engine's default)."""
    return body.get("max_completion_tokens") or body.get("max_tokens")


def tenant_cache_salt(tenant: str, client_salt: str | None = None) -> str:
    """The ``cache_salt`` the engine receives for a request of ``tenant``.

    vLLM's automatic prefix cache is shared by every request of a replica: a request
    that finds its prompt's prefix cached answers sooner, which would tell one tenant
    what another recently sent. vLLM mixes the salt into the hash of a prompt's first
    block, so requests with different salts never share a cached block. The salt is a
    digest of the tenant and the client's own salt (NUL cannot occur in a tenant name):
    a client may divide its tenant's cache further but cannot name another tenant's
    salt, since whatever it sends is hashed with its own tenant. It need not be secret:
    no client ever passes a salt to the engine unhashed. 64 hex digits: within vLLM's
    128 characters, none of its forbidden ones."""
    return hashlib.sha256(f"{tenant}\0{client_salt or ''}".encode()).hexdigest()


def parse_request(kind: Kind, body: dict[str, Any]) -> _CompletionBase:
    """Validate ``body`` (never changed: the dict itself is what is forwarded).

    Raises ``BadRequest`` naming the first unknown field, or the field that has the
    wrong shape."""
    unknown = sorted(set(body) - KNOWN_FIELDS[kind])
    if unknown:
        raise BadRequest(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0],
                         code="unsupported_parameter")
    try:
        return REQUEST_MODELS[kind].model_validate(body)
    except ValidationError as exc:
        raise _bad_request(exc) from None


def _bad_request(exc: ValidationError) -> BadRequest:
    first = exc.errors()[0]
    loc = first["loc"]
    field = str(loc[0]) if loc else "body"
    if field == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        return BadRequest(f"messages[{loc[1]}] must be an object with a string 'role'",
                          param=f"messages[{loc[1]}]")
    if first["type"] == "missing":
        return BadRequest(f"'{field}' is required: {_EXPECTED.get(field, 'a value')}", param=field)
    return BadRequest(f"'{field}' must be {_EXPECTED.get(field, 'valid')}", param=field)


# -- /openapi.json ------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body: what every refusal looks like, the engine's included."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": what} for status, what in (
        (400, "Invalid request: an unknown field, a malformed one, or over the context length"),
        (401, "Missing or invalid API key"),
        (404, "No such model (or not one this key may use)"),
        (413, "Request body over the size limit"),
        (429, "Over a rate limit, or the model's cold queue is full (see Retry-After)"),
        (503, "The model could not be started in time (see Retry-After)"),
    )
}
_REF = "#/components/schemas/{model}"


def request_body(kind: Kind, *, model_in_path: bool) -> dict[str, Any]:
    """The ``openapi_extra`` that documents a completion route's body. The route reads
    the raw body itself (with its size limit), so FastAPI must not parse it."""
    name = REQUEST_MODELS[kind].__name__ + ("ForModel" if model_in_path else "")
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": {"$ref": _REF.format(model=name)}}}}}


def request_schemas() -> dict[str, Any]:
    """Components for ``request_body``'s references. On ``/m/{model}/...`` the URL
    names the model, so the body's ``model`` is optional there."""
    out: dict[str, Any] = {}
    for kind, model in REQUEST_MODELS.items():
        schema = model.model_json_schema(ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        # Every field the activator accepts, so generators and fuzzers see them; any
        # other is refused (unsupported_parameter).
        openai = OPENAI_CHAT_FIELDS if kind == "chat" else OPENAI_COMPLETIONS_FIELDS
        for name in sorted(KNOWN_FIELDS[kind] - schema["properties"].keys()):
            schema["properties"][name] = {"description": "Passed to the engine as sent ("
                                          + ("OpenAI's field)." if name in openai else "a vLLM extension).")}
        schema["additionalProperties"] = False
        out[model.__name__] = schema
        for_model = copy.deepcopy(schema)
        for_model["required"] = [f for f in schema.get("required", []) if f != "model"]
        out[model.__name__ + "ForModel"] = for_model
    return out


# What needs no API key (everything else takes a tenant's key as the bearer).
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
SECURITY_SCHEME = "apiKey"


def add_request_schemas(openapi: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document, plus what it cannot see: the completion bodies (read raw),
    their answers (JSON, or server-sent events with ``stream``), and the API key."""
    components = openapi.setdefault("components", {})
    components.setdefault("schemas", {}).update(request_schemas())
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http", "scheme": "bearer", "description": "A tenant's API key"}
    for path, operations in openapi.get("paths", {}).items():
        for operation in operations.values():
            operation["security"] = [] if path in OPEN_PATHS else [{SECURITY_SCHEME: []}]
            ok = operation.get("responses", {}).get("200")
            if path.endswith("/completions") and ok is not None:
                ok["content"] = {"application/json": {"schema": {"type": "object"}},
                                 # Server-sent events, each a chunk (JSON in ``data``) or
                                 # ``data: [DONE]`` at the end.
                                 "text/event-stream": {"schema": {
                                     "type": "object", "required": ["data"],
                                     "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                                    "id": {"type": "string"}}}}}
    return openapi
