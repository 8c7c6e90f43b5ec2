"""The activator agrees with the engine: `thaw up` with a real vLLM (CPU) replica of the
demo model.

- The prompt count: for chats of every kind and for completions prompts, the
  activator's count (its own ``TokenCounter``, loading the model's tokenizer from the
  store as the activator does) equals the engine's ``usage.prompt_tokens``.
- The context limit: a request exactly at the model's context length is served; one
  token more is refused by the activator (``context_length_exceeded``).
- OpenAI's fields: every field of OpenAI's API reference reaches the engine; whatever it
  answers (200, or its own 400) reaches the client in OpenAI's shape, never as an
  activator ``unsupported_parameter``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from activator.protocol import OPENAI_CHAT_FIELDS, OPENAI_COMPLETIONS_FIELDS
from activator.tokens import ModelTokenizer, TokenCounter, s3_fetcher
from tests.e2e_stack import KEY, Stack, running_stack
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

MODEL = "thaw-demo"
CONTEXT = 512  # the model's max_context_tokens (vLLM's --max-model-len): short prompts reach it
# The demo model has random weights: ignore_eos makes lengths exact.
EXACT = {"ignore_eos": True}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        demo = cfg["models"][0]
        demo["max_context_tokens"] = CONTEXT
        demo["autoscaling"].update({"min_replicas": 1, "idle_grace_s": 600, "activation_timeout_s": 240})
        # Tools with the default tool_choice ("auto") need a tool-call parser.
        demo["engine"]["extra"] = {"enable_auto_tool_choice": True, "tool_call_parser": "pythonic"}

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("tokens"), configure) as s:
        s.wait_for("a ready replica",
                   lambda st: next(m for m in st["models"] if m["name"] == "demo")["replicas"] == {"ready": 1},
                   timeout_s=300)
        yield s


@pytest.fixture(scope="module")
def counter(stack: Stack, s3: S3Endpoint) -> ModelTokenizer:
    """The activator's tokenizer for the model, loaded from the store as it loads it."""
    uri = yaml.safe_load(stack.config.read_text())["models"][0]["uri"]
    tok = asyncio.run(TokenCounter(s3_fetcher(s3.client())).get(uri))
    assert tok is not None
    return tok


def client(stack: Stack) -> openai.OpenAI:
    return stack.client()


SYSTEM = {"role": "system", "content": "You are a terse assistant."}
CHATS: dict[str, dict[str, Any]] = {
    "user-only": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system-and-user": {"messages": [SYSTEM, {"role": "user", "content": "What is a thaw?"}]},
    "multi-turn": {"messages": [
        SYSTEM, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "And a third."}]},
    "tools": {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER]},
    "tool-call-and-result": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 °C"},
        {"role": "user", "content": "Thanks."}]},
    "unicode": {"messages": [{"role": "user", "content": "Grüße 👋🏽 — 你好，世界！ こんにちは 🇳🇴 ñ ∑ x² \u200b"}]},
    "empty-content": {"messages": [SYSTEM, {"role": "user", "content": ""}]},
    "text-parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}]},
    "tool-result-as-parts": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "Rain"},
                                                         {"type": "text", "text": "12 °C"}]}]},
    "developer-role": {"messages": [{"role": "developer", "content": "Answer in French."}, SYSTEM,
                                    {"role": "user", "content": "Hi"}]},
    "named-participant": {"messages": [{"role": "user", "name": "ada", "content": "Hi there"}]},
    "chat-template-kwargs": {"messages": [{"role": "user", "content": "Hi"}],
                             # The request's own add_generation_prompt wins over the kwargs' one.
                             "chat_template_kwargs": {"add_generation_prompt": False, "enable_thinking": True}},
    "no-generation-prompt": {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
    "continue-final-message": {"messages": [{"role": "user", "content": "Count:"},
                                            {"role": "assistant", "content": "one, two,"}],
                               "add_generation_prompt": False, "continue_final_message": True},
    "add-special-tokens": {"messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": True},
    "reasoning-effort": {"messages": [{"role": "user", "content": "Think."}], "reasoning_effort": "low"},
    "billing-header": {"messages": [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1234\nYou are helpful."},
        {"role": "user", "content": "Hi"}]},
    "truncated": {"messages": [{"role": "user", "content": "many words " * 40}], "truncate_prompt_tokens": 20},
}


def _split(body: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    rest = dict(body)
    return rest.pop("messages"), rest


@pytest.mark.parametrize("name", list(CHATS))
def test_chat_prompt_count_is_the_engines(stack: Stack, counter: ModelTokenizer, name: str) -> None:
    body = {"model": MODEL, **CHATS[name]}
    ours = counter.count("chat", body, max_model_len=CONTEXT)
    messages, extra = _split(CHATS[name])
    tools = extra.pop("tools", None)
    answer = client(stack).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, extra_body=extra,
        **({"tools": tools} if tools is not None else {}))
    assert answer.usage is not None
    assert ours == answer.usage.prompt_tokens, name


COMPLETIONS: dict[str, dict[str, Any]] = {
    "string": {"prompt": "Once upon a time"},
    "unicode": {"prompt": "Ünïcödé 🎉 中文 テキスト"},
    "token-ids": {"prompt": [5, 17, 300, 42, 9]},
    "strings": {"prompt": ["The first", "and the second prompt"]},
    "token-id-lists": {"prompt": [[1, 2, 3], [7, 8]]},
    "no-special-tokens": {"prompt": "Once upon a time", "add_special_tokens": False},
    "truncated": {"prompt": "word " * 50, "truncate_prompt_tokens": 10},
}


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_completions_prompt_count_is_the_engines(stack: Stack, counter: ModelTokenizer, name: str) -> None:
    body = {"model": MODEL, **COMPLETIONS[name]}
    ours = counter.count("completions", body, max_model_len=CONTEXT)
    extra = dict(COMPLETIONS[name])
    answer = client(stack).completions.create(model=MODEL, prompt=extra.pop("prompt"), max_tokens=1,
                                              extra_body=extra)
    assert answer.usage is not None
    # A batch is one usage for all its prompts.
    assert ours == answer.usage.prompt_tokens, name


def test_a_request_exactly_at_the_context_limit_is_served_and_one_token_more_is_refused(
    stack: Stack, counter: ModelTokenizer
) -> None:
    words: list[str] = []
    prompt = 0
    while prompt < CONTEXT - 8:  # a prompt a few tokens short of the limit
        words.append(f"lorem{len(words) % 7}")
        messages = [SYSTEM, {"role": "user", "content": " ".join(words)}]
        prompt = counter.count("chat", {"model": MODEL, "messages": messages}) or 0
    assert prompt < CONTEXT
    # prompt + max_tokens == the context length: served, every token generated.
    at_limit = CONTEXT - prompt
    answer = client(stack).chat.completions.create(model=MODEL, messages=messages, max_tokens=at_limit,
                                                   extra_body=EXACT)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, at_limit)
    # One token more, by max_tokens or by the prompt: refused before the engine.
    with pytest.raises(openai.BadRequestError) as over:
        client(stack).chat.completions.create(model=MODEL, messages=messages, max_tokens=at_limit + 1)
    err = over.value.response.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", "max_tokens")
    assert f"maximum context length is {CONTEXT} tokens" in err["message"]
    assert f"{prompt} in the prompt + {at_limit + 1} to generate" in err["message"]

    # The completions prompt alone at the limit is served; a token more is refused.
    ids = list(range(10, 10 + CONTEXT - 1))
    served = client(stack).completions.create(model=MODEL, prompt=ids, max_tokens=1, extra_body=EXACT)
    assert served.usage is not None and served.usage.prompt_tokens + 1 == CONTEXT
    with pytest.raises(openai.BadRequestError) as long:
        client(stack).completions.create(model=MODEL, prompt=[*ids, 11], max_tokens=1)
    err = long.value.response.json()["error"]
    assert err["code"] == "context_length_exceeded"


# A plausible value for each OpenAI field (what a client would send). The engine may
# use it, ignore it, or refuse it; the activator passes it on either way.
SAMPLE: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"}, "frequency_penalty": 0.1,
    "function_call": "none", "functions": [WEATHER["function"]], "logit_bias": {"5": 1},
    "logprobs": {"chat": True, "completions": 2}, "max_completion_tokens": 2, "max_tokens": 2, "metadata": {"team": "search"},
    "modalities": ["text"], "moderation": {"mode": "off"}, "n": 1, "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "Sunny"}, "presence_penalty": 0.1,
    "prompt_cache_key": "conversation-7", "prompt_cache_options": {}, "prompt_cache_retention": "24h",
    "reasoning_effort": "low", "response_format": {"type": "text"}, "safety_identifier": "user-hash-1",
    "seed": 3, "service_tier": "auto", "stop": ["\n\n"], "store": False, "stream": False,
    "stream_options": {"include_usage": True}, "temperature": 0.7, "tool_choice": "none",
    "tools": [WEATHER], "top_logprobs": 2, "top_p": 0.9, "user": "user-1", "verbosity": "low",
    "web_search_options": {},
    # completions
    "best_of": 1, "echo": True, "suffix": " the end.",
}
FORMERLY_REFUSED = {"metadata", "store", "service_tier", "prediction", "reasoning_effort", "modalities", "audio",
                    "web_search_options", "logprobs", "verbosity", "prompt_cache_key", "safety_identifier",
                    "user", "functions", "function_call", "stream_options"}


def assert_openai_shape(r: httpx.Response) -> dict[str, Any]:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str)
    assert err["code"] != "unsupported_parameter"
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(("kind", "field"), [("chat", f) for f in sorted(OPENAI_CHAT_FIELDS - {"model", "messages"})]
                         + [("completions", f) for f in sorted(OPENAI_COMPLETIONS_FIELDS - {"model", "prompt"})])
def test_every_openai_field_reaches_the_engine(stack: Stack, kind: str, field: str) -> None:
    value = SAMPLE[field]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2,
                            field: value[kind] if isinstance(value, dict) and kind in value else value}
    if field == "stream_options":
        body["stream"] = True  # only meaningful with it
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "Weather in Oslo?"}]
        if field == "function_call":
            body["functions"] = SAMPLE["functions"]
    else:
        body["prompt"] = "Once upon a time"
    path = "/chat/completions" if kind == "chat" else "/completions"
    r = httpx.post(stack.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    if r.status_code == 200 and body.get("stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
    elif r.status_code != 200:
        # The engine's own answer, in OpenAI's shape.
        assert r.status_code == 400, r.text
        err = assert_openai_shape(r)
        assert field not in FORMERLY_REFUSED, (field, r.text)
        print(f"the engine refuses {kind} {field}={body[field]!r}: {err['message']}")  # shown with -s
    else:
        assert r.json()["usage"]["prompt_tokens"] > 0


def test_a_value_the_engine_refuses_comes_back_as_its_400_in_openais_shape(stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "reasoning_effort": "maximal"}
    for stream in (False, True):
        r = httpx.post(stack.base_url + "/chat/completions", json={**body, "stream": stream},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"] == "application/json"
        err = assert_openai_shape(r)
        assert err["type"] == "invalid_request_error" and "reasoning_effort" in err["message"]


def test_the_vllm_field_lists_are_the_installed_vllms() -> None:
    # Written out in activator.protocol (the activator never imports vLLM): a vLLM
    # upgrade that adds or drops a request field shows here.
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from activator.protocol import VLLM_CHAT_FIELDS, VLLM_COMPLETIONS_FIELDS

    assert VLLM_CHAT_FIELDS == set(ChatCompletionRequest.model_fields) - OPENAI_CHAT_FIELDS
    assert VLLM_COMPLETIONS_FIELDS == set(CompletionRequest.model_fields) - OPENAI_COMPLETIONS_FIELDS
