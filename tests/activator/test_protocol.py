"""The API edge: which fields pass, which are refused and how, what /openapi.json says.

Against fake engines (no vLLM): the engine's side of the same rules is
tests/test_e2e_prompt_tokens.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from activator.app import create_app
from activator.protocol import (
    OPENAI_CHAT_FIELDS,
    OPENAI_COMPLETIONS_FIELDS,
    VLLM_CHAT_FIELDS,
    VLLM_COMPLETIONS_FIELDS,
    tenant_cache_salt,
)
from tests.activator.fake_engine import FakeEngine, serve
from tests.activator.support import KEY, assert_openai_error, make_config, replica, table
from thaw.config import parse_config
from thaw.embedded_store import free_port

AUTH = {"Authorization": f"Bearer {KEY}"}
PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# A value of the right shape for each field the activator validates; any other field
# gets an arbitrary JSON value: the activator must forward it untouched.
VALID = {
    "model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}], "prompt": "Once upon",
    "stream": False, "stream_options": {"include_usage": True}, "n": 1, "max_tokens": 4,
    "max_completion_tokens": 4, "cache_salt": "my-own-salt",
}
ANY = {"nested": [1, "two", None, {"three": 3.5}], "flag": True}


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[FakeEngine, str]]:
    e = FakeEngine("protocol")
    with serve(e) as url:
        yield e, url


@pytest.fixture
async def client(engine: tuple[FakeEngine, str], tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    data = make_config(tmp_path).model_dump(mode="json")
    data["server"]["max_body_bytes"] = 100_000
    app = create_app(parse_config(data), f"http://127.0.0.1:{free_port()}", activator_id="proto")
    app.state.routes.apply(table(1, [replica(engine[1])]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as c:
        yield c
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()


def body_with(fields: frozenset[str]) -> dict[str, Any]:
    return {name: VALID.get(name, ANY) for name in sorted(fields)}


@pytest.mark.parametrize(("kind", "fields"), [
    ("chat", OPENAI_CHAT_FIELDS), ("completions", OPENAI_COMPLETIONS_FIELDS),
    ("chat", VLLM_CHAT_FIELDS | {"model", "messages"}), ("completions", VLLM_COMPLETIONS_FIELDS | {"model", "prompt"}),
], ids=["openai-chat", "openai-completions", "vllm-chat", "vllm-completions"])
async def test_every_documented_field_is_forwarded_unchanged(
    client: httpx.AsyncClient, engine: tuple[FakeEngine, str], kind: str, fields: frozenset[str]
) -> None:
    fake, _ = engine
    body = body_with(fields)
    r = await client.post(PATH[kind], json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    sent = fake.requests[-1]["body"]
    # Only the model is renamed (to the name the replica serves it under) and the cache
    # salt set: the tenant's, with the client's own in it (test_tenant_isolation).
    assert sent == {**body, "model": "served-demo", "cache_salt": tenant_cache_salt("all", body.get("cache_salt"))}


@pytest.mark.parametrize(("kind", "field"), [
    ("chat", "frobnicate"),
    ("completions", "frobnicate"),
    ("completions", "messages"),  # a chat field on the completions endpoint
    ("completions", "tools"),
    ("chat", "prompt"),
])
async def test_an_unknown_field_is_400_naming_it(
    client: httpx.AsyncClient, engine: tuple[FakeEngine, str], kind: str, field: str
) -> None:
    fake, _ = engine
    before = len(fake.requests)
    body = {**body_with(frozenset({"model", "messages" if kind == "chat" else "prompt"})), field: 1}
    r = await client.post(PATH[kind], json=body, headers=AUTH)
    err = assert_openai_error(r, 400, "unsupported_parameter", field)
    # OpenAI's own words for it.
    assert err["message"] == f"Unrecognized request argument supplied: {field}"
    assert err["type"] == "invalid_request_error"
    assert len(fake.requests) == before


@pytest.mark.parametrize(("kind", "patch", "param", "fragment"), [
    ("chat", {"messages": []}, "messages", "non-empty array"),
    ("chat", {"messages": "hi"}, "messages", "non-empty array"),
    ("chat", {"messages": None}, "messages", "non-empty array"),
    ("chat", {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}, "messages[1]", "string 'role'"),
    ("chat", {"messages": [{"role": 7}]}, "messages[0]", "string 'role'"),
    ("chat", {"messages": ["hi"]}, "messages[0]", "string 'role'"),
    ("chat", {"stream": "yes"}, "stream", "must be a boolean"),
    ("chat", {"stream": 1}, "stream", "must be a boolean"),
    ("chat", {"stream_options": {"include_usage": "yes"}}, "stream_options", "'include_usage' is a boolean"),
    ("chat", {"stream_options": "usage"}, "stream_options", "an object"),
    ("chat", {"max_tokens": 0}, "max_tokens", "positive integer"),
    ("chat", {"max_tokens": True}, "max_tokens", "positive integer"),  # a bool is no count
    ("chat", {"max_tokens": 2.5}, "max_tokens", "positive integer"),
    ("chat", {"max_tokens": "3"}, "max_tokens", "positive integer"),
    ("chat", {"max_completion_tokens": -1}, "max_completion_tokens", "positive integer"),
    ("chat", {"n": 0}, "n", "positive integer"),
    ("chat", {"n": False}, "n", "positive integer"),
    ("chat", {"model": 7}, "model", "'model' is required"),
    ("completions", {"prompt": None}, "prompt", "non-empty string"),
    ("completions", {"prompt": ""}, "prompt", "non-empty string"),
    ("completions", {"prompt": []}, "prompt", "non-empty string"),
    ("completions", {"prompt": [1, "two"]}, "prompt", "token ids"),
    ("completions", {"prompt": [[]]}, "prompt", "token-id arrays"),
    ("completions", {"prompt": [-1]}, "prompt", "token ids"),
    ("completions", {"prompt": [True]}, "prompt", "token ids"),
    ("completions", {"prompt": {"text": "hi"}}, "prompt", "non-empty string"),
    ("completions", {"max_tokens": 0}, "max_tokens", "positive integer"),
])
async def test_a_malformed_field_is_400_with_its_param(
    client: httpx.AsyncClient, engine: tuple[FakeEngine, str], kind: str, patch: dict[str, Any], param: str,
    fragment: str,
) -> None:
    fake, _ = engine
    before = len(fake.requests)
    body = {**body_with(frozenset({"model", "messages" if kind == "chat" else "prompt"})), **patch}
    r = await client.post(PATH[kind], json=body, headers=AUTH)
    err = assert_openai_error(r, 400, param=param)
    assert fragment in err["message"]
    assert len(fake.requests) == before


async def test_a_missing_prompt_is_named(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"model": "thaw-demo"}, headers=AUTH)
    assert "'prompt' is required" in assert_openai_error(r, 400, param="prompt")["message"]


@pytest.mark.parametrize("prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
async def test_every_prompt_shape_passes(client: httpx.AsyncClient, prompt: Any) -> None:
    r = await client.post("/v1/completions", json={"model": "thaw-demo", "prompt": prompt}, headers=AUTH)
    assert r.status_code == 200, r.text


async def test_a_null_stream_is_not_streaming(client: httpx.AsyncClient) -> None:
    # OpenAI's spec makes stream nullable.
    body = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}], "stream": None}
    r = await client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"


class RefusingEngine(FakeEngine):
    """Answers every request as vLLM refuses one: 400, its error body (code: a number)."""

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            self.requests.append({"kind": "chat", "body": await request.json(), "request_id": None})
            return JSONResponse({"error": {"message": "reasoning_effort: input should be 'low', 'medium' or 'high'",
                                           "type": "BadRequestError", "param": "reasoning_effort", "code": 400}},
                                status_code=400)

        return app


@pytest.mark.parametrize("stream", [False, True])
async def test_the_engines_refusal_reaches_the_client_in_openais_shape(tmp_path: Path, stream: bool) -> None:
    app = create_app(make_config(tmp_path), f"http://127.0.0.1:{free_port()}", activator_id="refused")
    refusing = RefusingEngine("refusing")
    with serve(refusing) as url:
        app.state.routes.apply(table(1, [replica(url)]))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://act") as c:
            body = {"model": "thaw-demo", "messages": [{"role": "user", "content": "hi"}],
                    "reasoning_effort": "maximal", "stream": stream}
            r = await c.post("/v1/chat/completions", json=body, headers=AUTH)
    await app.state.routes.close()
    await app.state.service.close()
    app.state.ledger.close()
    assert refusing.requests[0]["body"]["reasoning_effort"] == "maximal"  # the engine judged it
    err = assert_openai_error(r, 400, param="reasoning_effort")
    assert err == {"message": "reasoning_effort: input should be 'low', 'medium' or 'high'",
                   "type": "invalid_request_error", "param": "reasoning_effort", "code": None}
    assert r.headers["content-type"] == "application/json"


async def test_openapi_documents_every_completion_body(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node["$ref"]
        assert ref.startswith("#/components/schemas/")
        return schemas[ref.rsplit("/", 1)[1]]  # type: ignore[no-any-return]

    for path, fields, needs in [
        ("/v1/chat/completions", OPENAI_CHAT_FIELDS | VLLM_CHAT_FIELDS, {"model", "messages"}),
        ("/m/{model}/v1/chat/completions", OPENAI_CHAT_FIELDS | VLLM_CHAT_FIELDS, {"messages"}),
        ("/v1/completions", OPENAI_COMPLETIONS_FIELDS | VLLM_COMPLETIONS_FIELDS, {"model", "prompt"}),
        ("/m/{model}/v1/completions", OPENAI_COMPLETIONS_FIELDS | VLLM_COMPLETIONS_FIELDS, {"prompt"}),
    ]:
        op = spec["paths"][path]["post"]
        body = op["requestBody"]
        assert body["required"] is True
        schema = resolve(body["content"]["application/json"]["schema"])
        # Every accepted field is listed, nothing else is accepted.
        assert set(schema["properties"]) == fields and schema["additionalProperties"] is False
        assert set(schema["required"]) == needs, path
        for status in ("400", "401", "404", "413", "429", "503"):
            error = resolve(op["responses"][status]["content"]["application/json"]["schema"])
            assert set(resolve(error["properties"]["error"])["required"]) == {"message", "type", "param", "code"}
    assert schemas["ChatMessage"]["required"] == ["role"]
    # The Files and Batches bodies too (their routes read the raw body).
    upload = spec["paths"]["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert upload["required"] == ["file", "purpose"] and upload["properties"]["purpose"]["enum"] == ["batch"]
    create = spec["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(create["required"]) == {"input_file_id", "endpoint", "completion_window"}
    assert create["properties"]["endpoint"]["enum"] == ["/v1/chat/completions", "/v1/completions"]
    # The Responses and Conversations routes: their bodies (closed), their errors in OpenAI's shape.
    responses = spec["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert responses["additionalProperties"] is False and responses["required"] == ["model"]  # input too is optional
    assert {"input", "previous_response_id", "conversation", "store", "truncation", "tools"} <= set(
        responses["properties"])
    for path, method, body_needs in [
        ("/v1/responses", "post", ["model"]), ("/v1/responses/{response_id}", "get", None),
        ("/v1/responses/{response_id}", "delete", None), ("/v1/responses/{response_id}/input_items", "get", None),
        ("/v1/conversations", "post", []), ("/v1/conversations/{conversation_id}", "get", None),
        ("/v1/conversations/{conversation_id}", "post", ["metadata"]),
        ("/v1/conversations/{conversation_id}", "delete", None),
        ("/v1/conversations/{conversation_id}/items", "get", None),
        ("/v1/conversations/{conversation_id}/items", "post", ["items"]),
        ("/v1/conversations/{conversation_id}/items/{item_id}", "get", None),
        ("/v1/conversations/{conversation_id}/items/{item_id}", "delete", None),
    ]:
        op = spec["paths"][path][method]
        if body_needs is not None:
            body = op["requestBody"]["content"]["application/json"]["schema"]
            assert body["additionalProperties"] is False and body.get("required", []) == body_needs, (path, method)
        for status in ("400", "401", "404", "503"):
            error = resolve(op["responses"][status]["content"]["application/json"]["schema"])
            assert set(resolve(error["properties"]["error"])["required"]) == {"message", "type", "param", "code"}
    json.dumps(spec)  # serialisable as served


async def test_on_a_models_own_path_the_body_needs_no_model(
    client: httpx.AsyncClient, engine: tuple[FakeEngine, str]
) -> None:
    fake, _ = engine
    body = {"messages": [{"role": "user", "content": "hi"}], "metadata": {"k": "v"}}
    r = await client.post("/m/thaw-demo/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    # As sent, but for the served name and the tenant's cache salt (test_tenant_isolation).
    assert fake.requests[-1]["body"] == {**body, "model": "served-demo", "cache_salt": tenant_cache_salt("all")}
