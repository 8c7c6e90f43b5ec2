"""OpenAI compatibility end to end: the official `openai` client against `thaw up` with a
real vLLM (CPU) replica. Each parameter the activator passes through is checked by its
effect on the answer, streamed and not; each error path by its status, its OpenAI error
shape and its headers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e_stack import Stack, running_stack
from thaw.config import hash_api_key
from thaw.embedded_store import EmbeddedStore
from thaw.objstore import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.engine]

MODEL = "thaw-demo"
NARROW_KEY = "narrow-key"      # a tenant that may use only another model
LIMITED_KEY = "limited-key"    # a tenant with 2 requests per minute
TOKENS_KEY = "tokens-key"      # a tenant with 400 tokens per minute
MAX_BODY = 64 * 1024
MSGS = [{"role": "user", "content": "Tell me a story."}]
# The demo model has random weights: ignore_eos makes lengths exact.
EXACT = {"ignore_eos": True}


@pytest.fixture(scope="module")
def stack(store: EmbeddedStore, s3: S3Endpoint, demo_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def configure(cfg: dict[str, Any], uri: str) -> None:
        cfg["server"]["max_body_bytes"] = MAX_BODY
        demo = cfg["models"][0]
        demo["autoscaling"].update({"min_replicas": 1, "idle_grace_s": 600, "activation_timeout_s": 240})
        # Named tool choices need a tool-call parser on the engine (any parser: the
        # named choice itself is enforced by structured outputs).
        demo["engine"]["extra"] = {"enable_auto_tool_choice": True, "tool_call_parser": "pythonic"}
        # A model only the narrow tenant may use (never requested, so never loaded).
        cfg["models"].append({**demo, "name": "other", "served_name": "other",
                              "autoscaling": {**demo["autoscaling"], "min_replicas": 0}})
        cfg["tenants"] += [
            {"name": "narrow", "api_key_hashes": [hash_api_key(NARROW_KEY)], "allowed_models": ["other"]},
            {"name": "limited", "api_key_hashes": [hash_api_key(LIMITED_KEY)],
             "limits": {"requests_per_minute": 2}},
            {"name": "tokenlimited", "api_key_hashes": [hash_api_key(TOKENS_KEY)],
             "limits": {"tokens_per_minute": 400}},
        ]

    with running_stack(store, s3, demo_model_dir, tmp_path_factory.mktemp("compat"), configure) as s:
        s.wait_for("a ready replica",
                   lambda st: next(m for m in st["models"] if m["name"] == "demo")["replicas"] == {"ready": 1},
                   timeout_s=300)
        yield s


def chat(stack: Stack, **kw: Any) -> Any:
    return stack.client().chat.completions.create(model=MODEL, messages=kw.pop("messages", MSGS), **kw)


def chat_stream(stack: Stack, **kw: Any) -> list[Any]:
    return list(stack.client().chat.completions.create(
        model=MODEL, messages=kw.pop("messages", MSGS), stream=True, **kw))


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks
                   if c.choices and c.choices[0].index == index)


# -- parameters -------------------------------------------------------------------------
@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_bounds_the_answer(stack: Stack, param: str) -> None:
    whole = chat(stack, **{param: 5}, extra_body=EXACT)
    assert whole.usage.completion_tokens == 5 and whole.choices[0].finish_reason == "length"
    chunks = chat_stream(stack, **{param: 7}, stream_options={"include_usage": True}, extra_body=EXACT)
    assert chunks[-1].usage.completion_tokens == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_seed_makes_sampling_repeatable_streamed_or_not(stack: Stack) -> None:
    kw = {"max_tokens": 12, "temperature": 1.0, "extra_body": EXACT}
    a = chat(stack, seed=7, **kw).choices[0].message.content
    b = chat(stack, seed=7, **kw).choices[0].message.content
    streamed = streamed_text(chat_stream(stack, seed=7, **kw))
    other = [chat(stack, seed=s, **kw).choices[0].message.content for s in (8, 9)]
    assert a == b == streamed
    assert any(o != a for o in other)


def test_n_returns_that_many_choices(stack: Stack) -> None:
    whole = chat(stack, n=2, max_tokens=4, temperature=1.0, seed=3, extra_body=EXACT)
    assert sorted(c.index for c in whole.choices) == [0, 1]
    assert whole.usage.completion_tokens == 8
    chunks = chat_stream(stack, n=2, max_tokens=4, temperature=1.0, seed=3, extra_body=EXACT)
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert streamed_text(chunks, 0) and streamed_text(chunks, 1)


def test_stop_ends_the_answer_before_the_stop_string(stack: Stack) -> None:
    kw = {"max_tokens": 24, "temperature": 1.0, "seed": 11, "extra_body": EXACT}
    full = chat(stack, **kw).choices[0].message.content
    # A stop string taken from the middle of the seeded answer: the same seed
    # generates the same text up to it, and the answer ends just before it.
    stop = next(full[i:i + 2] for i in range(len(full) // 3, len(full) - 2) if full[i:i + 2].strip())
    expected = full[: full.find(stop)]
    whole = chat(stack, stop=[stop], **kw)
    assert whole.choices[0].message.content == expected and whole.choices[0].finish_reason == "stop"
    chunks = chat_stream(stack, stop=stop, **kw)
    assert streamed_text(chunks) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_logprobs_come_back_with_top_alternatives(stack: Stack) -> None:
    whole = chat(stack, max_tokens=3, logprobs=True, top_logprobs=2, extra_body=EXACT)
    content = whole.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    chunks = chat_stream(stack, max_tokens=3, logprobs=True, top_logprobs=2, extra_body=EXACT)
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(streamed) == 3 and all(len(t.top_logprobs) == 2 for t in streamed)


def test_usage_chunk_only_when_the_client_asks(stack: Stack) -> None:
    without = chat_stream(stack, max_tokens=3, extra_body=EXACT)
    assert not any(getattr(c, "usage", None) for c in without)
    with_usage = chat_stream(stack, max_tokens=3, stream_options={"include_usage": True}, extra_body=EXACT)
    last = with_usage[-1]
    assert last.choices == [] and last.usage.completion_tokens == 3 and last.usage.prompt_tokens > 0
    assert not any(getattr(c, "usage", None) for c in with_usage[:-1])


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}


def test_response_format_json_schema_reaches_the_engine(stack: Stack) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    whole = chat(stack, max_tokens=64, response_format=fmt)
    assert json.loads(whole.choices[0].message.content)["answer"] in ("yes", "no")
    chunks = chat_stream(stack, max_tokens=64, response_format=fmt)
    assert json.loads(streamed_text(chunks))["answer"] in ("yes", "no")


def test_tools_with_a_named_tool_choice_return_a_call(stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "verdict", "description": "Give a verdict.",
                                               "parameters": SCHEMA}}]
    choice = {"type": "function", "function": {"name": "verdict"}}
    whole = chat(stack, max_tokens=64, tools=tools, tool_choice=choice)
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "verdict" and json.loads(call.function.arguments)["answer"] in ("yes", "no")
    chunks = chat_stream(stack, max_tokens=64, tools=tools, tool_choice=choice)
    deltas = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert deltas[0].function.name == "verdict"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args)["answer"] in ("yes", "no")


def test_text_completions_streamed_and_not(stack: Stack) -> None:
    client = stack.client()
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, echo=True,
                                      logprobs=2, seed=5, temperature=1.0, extra_body=EXACT)
    choice = whole.choices[0]
    assert choice.text.startswith("Once upon a time") and whole.usage.completion_tokens == 4
    assert all(len(alts) <= 3 for alts in choice.logprobs.top_logprobs if alts)  # 2 + the chosen token
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, seed=5,
                                      temperature=1.0, extra_body=EXACT)
    stream = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, seed=5,
                                            temperature=1.0, stream=True, stream_options={"include_usage": True},
                                            extra_body=EXACT))
    assert "".join(c.choices[0].text for c in stream if c.choices) == plain.choices[0].text
    assert stream[-1].usage.completion_tokens == 4
    two = client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2, n=2, extra_body=EXACT)
    assert sorted(c.index for c in two.choices) == [0, 1, 2, 3]


def test_get_one_model(stack: Stack) -> None:
    m = stack.client().models.retrieve(MODEL)
    assert m.id == MODEL
    with pytest.raises(openai.NotFoundError):
        stack.client().models.retrieve("no-such-model")


# -- error paths ------------------------------------------------------------------------
def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    err = exc.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_bad_key_is_401(stack: Stack) -> None:
    bad = openai.OpenAI(base_url=stack.base_url, api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model=MODEL, messages=MSGS)
    assert info.value.status_code == 401 and error_of(info.value)["code"] == "invalid_api_key"


def test_a_model_the_tenant_may_not_use_is_404_as_if_absent(stack: Stack) -> None:
    narrow = openai.OpenAI(base_url=stack.base_url, api_key=NARROW_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as forbidden:
        narrow.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    with pytest.raises(openai.NotFoundError) as absent:
        narrow.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=2)
    f, a = error_of(forbidden.value), error_of(absent.value)
    assert f["code"] == a["code"] == "model_not_found"
    assert f["message"].replace(MODEL, "X") == a["message"].replace("no-such-model", "X")
    assert MODEL not in [m.id for m in narrow.models.list().data]


def test_unsupported_parameter_is_400_naming_it(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(stack, max_tokens=2, extra_body={"frobnicate": True})
    assert error_of(info.value)["param"] == "frobnicate"
    with pytest.raises(openai.BadRequestError) as bad_type:
        chat(stack, max_tokens="many")
    assert error_of(bad_type.value)["param"] == "max_tokens"


def test_context_length_exceeded_before_any_gpu_work(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(stack, max_tokens=5000)
    err = error_of(info.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    long_prompt = [{"role": "user", "content": "lorem ipsum dolor sit amet " * 500}]
    with pytest.raises(openai.BadRequestError) as long:
        chat(stack, messages=long_prompt, max_tokens=2)
    assert error_of(long.value)["code"] == "context_length_exceeded"
    assert error_of(long.value)["param"] == "messages"


def test_body_over_the_limit_is_413(stack: Stack) -> None:
    huge = [{"role": "user", "content": "x" * (MAX_BODY + 1)}]
    with pytest.raises(openai.APIStatusError) as info:
        chat(stack, messages=huge, max_tokens=2)
    assert info.value.status_code == 413 and error_of(info.value)["type"] == "invalid_request_error"


def test_over_the_request_rate_is_429_with_the_headers(stack: Stack) -> None:
    limited = openai.OpenAI(base_url=stack.base_url, api_key=LIMITED_KEY, max_retries=0)
    ok = limited.chat.completions.with_raw_response.create(model=MODEL, messages=MSGS, max_tokens=2)
    assert ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["x-ratelimit-remaining-requests"] == "1"
    limited.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as info:
        limited.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    h = info.value.response.headers
    assert info.value.status_code == 429 and error_of(info.value)["code"] == "rate_limit_requests"
    assert h["x-ratelimit-remaining-requests"] == "0" and h["x-ratelimit-reset-requests"].endswith("s")
    assert float(h["retry-after"]) > 0
    # Another tenant is not affected.
    assert chat(stack, max_tokens=2).choices


def test_over_the_token_rate_is_429_with_the_token_headers(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key=TOKENS_KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError) as too_big:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=500)
    assert error_of(too_big.value)["code"] == "tokens_exceeded"  # more than a minute's worth
    ok = client.chat.completions.with_raw_response.create(model=MODEL, messages=MSGS, max_tokens=300,
                                                          extra_body=EXACT)
    assert ok.headers["x-ratelimit-limit-tokens"] == "400"
    assert ok.parse().usage.completion_tokens == 300
    # 400 - (prompt + 300 used) leaves less than the next request's prompt + 200.
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=200)
    h = info.value.response.headers
    assert error_of(info.value)["code"] == "rate_limit_tokens"
    assert int(h["x-ratelimit-remaining-tokens"]) < 200 and h["x-ratelimit-reset-tokens"].endswith("s")
    assert float(h["retry-after"]) > 0


# -- the Responses API (activator/conversations/responses.py) ---------------------------------------------


def prompt_tokens(client: openai.OpenAI, messages: list[dict[str, Any]]) -> int:
    """What the engine counts for these chat messages."""
    usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage  # type: ignore[arg-type]
    assert usage is not None
    return usage.prompt_tokens


def test_a_three_turn_conversation_counts_the_whole_history(stack: Stack) -> None:
    client = stack.client()
    history: list[dict[str, Any]] = []
    previous = None
    for turn in ("Tell me a story.", "Go on.", "And then?"):
        r = client.responses.create(model=MODEL, input=turn, previous_response_id=previous, max_output_tokens=8,
                                    temperature=0)
        history.append({"role": "user", "content": turn})
        # The engine counted the whole rendered history, as a chat completion of it does.
        assert r.usage is not None and r.usage.input_tokens == prompt_tokens(client, history), turn
        assert r.status in ("completed", "incomplete") and r.output_text
        history.append({"role": "assistant", "content": r.output_text})
        previous = r.id
    assert client.responses.retrieve(previous).id == previous
    # Another tenant: a 404 for the same id.
    narrow = openai.OpenAI(base_url=stack.base_url, api_key=NARROW_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        narrow.responses.retrieve(previous)


def test_a_streamed_response_in_the_sdks_event_order(stack: Stack) -> None:
    client = stack.client()
    with client.responses.create(model=MODEL, input="Tell me a story.", max_output_tokens=6, stream=True) as s:
        events = list(s)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          kinds[-1]] and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert done.output_text == text and done.usage is not None and done.usage.output_tokens == 6
    assert client.responses.retrieve(done.id).output_text == text


def test_truncation_auto_drops_the_oldest_items_and_disabled_refuses(stack: Stack) -> None:
    client = stack.client()
    long = [{"role": "user", "content": f"Item {i}: " + "words " * 150} for i in range(20)]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=long, max_output_tokens=4)  # type: ignore[arg-type]
    assert e.value.code == "context_length_exceeded"
    r = client.responses.create(model=MODEL, input=long, max_output_tokens=4, truncation="auto")  # type: ignore[arg-type]
    dropped = (r.model_extra or {}).get("thaw", {}).get("truncated_items")
    assert r.usage is not None and dropped and 0 < dropped < 20
    assert r.usage.input_tokens + 4 <= 2048


def test_a_conversation_holds_its_turns(stack: Stack) -> None:
    client = stack.client()
    conv = client.conversations.create(items=[{"role": "user", "content": "Tell me a story."}])
    r = client.responses.create(model=MODEL, input="Go on.", conversation=conv.id, max_output_tokens=6)
    history = [{"role": "user", "content": "Tell me a story."}, {"role": "user", "content": "Go on."}]
    assert r.usage is not None and r.usage.input_tokens == prompt_tokens(client, history)
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [i.role for i in items] == ["user", "user", "assistant"]  # type: ignore[union-attr]
    narrow = openai.OpenAI(base_url=stack.base_url, api_key=NARROW_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        narrow.conversations.retrieve(conv.id)
