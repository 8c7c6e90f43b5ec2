"""The Responses API in chat terms (activator/conversations/items.py): items in one shape,
rendered as chat messages, a chat answer as output items, and a chat stream as the
Responses event stream, each event valid as the official SDK types it."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from activator.conversations.items import (
    ItemError,
    StreamTranslator,
    chat_messages,
    chat_tool_choice,
    chat_tools,
    input_items,
    output_items,
    output_text,
    response_usage,
    sse,
)

EVENT = TypeAdapter(ResponseStreamEvent)


def test_a_string_input_is_one_user_message() -> None:
    [item] = input_items("Hello")
    assert item["type"] == "message" and item["role"] == "user" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]


def test_items_of_every_kind_render_as_chat_messages_in_order() -> None:
    history = input_items([
        {"role": "user", "content": "What is the weather in Oslo and Rome?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": "sun"},
    ])
    new = input_items([{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be "},
                                                                           {"type": "input_text", "text": "brief"}]}])
    messages = chat_messages("You are terse.", [*history, *new])
    assert messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Oslo and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "sun"},
        {"role": "system", "content": "Be brief"},
    ]


@pytest.mark.parametrize(("value", "param"), [
    ([], "input"),
    (42, "input"),
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content[0]"),
    ([{"type": "function_call", "call_id": "c", "name": "f"}], "input[0].arguments"),
    ([{"type": "web_search_call"}], "input[0].type"),
    (["text"], "input[0]"),
    ([{"role": "user", "content": "x", "id": "m" * 101}], "input[0].id"),
])
def test_a_malformed_item_is_named(value: Any, param: str) -> None:
    with pytest.raises(ItemError) as e:
        input_items(value)
    assert e.value.param == param


def test_function_tools_and_tool_choice_in_chat_shape() -> None:
    tools = [{"type": "function", "name": "weather", "description": "d", "parameters": {"type": "object"}}]
    assert chat_tools(tools) == [{"type": "function", "function": {"name": "weather", "description": "d",
                                                                   "parameters": {"type": "object"}}}]
    assert chat_tool_choice({"type": "function", "name": "weather"}) == {"type": "function",
                                                                         "function": {"name": "weather"}}
    assert chat_tool_choice("auto") == "auto" and chat_tools(None) is None
    with pytest.raises(ItemError) as e:
        chat_tools([{"type": "web_search"}])
    assert e.value.param == "tools[0]"


def response(items: list[dict[str, Any]], usage: dict[str, Any] | None, status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1.0, "status": status, "model": "m", "output": items,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": usage, "error": None,
            "incomplete_details": None, "instructions": None, "metadata": {}, "store": True}


def test_a_chat_answer_as_a_response_the_sdk_reads() -> None:
    items = output_items({"content": "Hi there", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, finish_reason="stop")
    usage = response_usage({"prompt_tokens": 12, "completion_tokens": 3,
                            "prompt_tokens_details": {"cached_tokens": 8}})
    r = Response.model_validate(response(items, usage))
    assert r.output_text == "Hi there" == output_text(items)
    assert r.usage is not None and r.usage.input_tokens_details.cached_tokens == 8 and r.usage.total_tokens == 15
    assert r.output[1].type == "function_call" and r.output[1].call_id == "call_1"
    cut = output_items({"content": "Hi"}, finish_reason="length")
    assert cut[0]["status"] == "incomplete"


def test_a_chat_stream_becomes_the_responses_event_stream() -> None:
    t = StreamTranslator()
    events = t.start(response([], None, status="in_progress"))
    for chunk in ({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}):
        events += t.feed(chunk)
    closing, items = t.finish()
    events += closing
    events.append(t.completed(response(items, response_usage(t.usage))))
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for e in events:
        EVENT.validate_python(e)  # every event is one the SDK knows, with its fields
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert sse(events[4]).startswith(b"event: response.output_text.delta\ndata: {")


def test_streamed_tool_calls_become_function_call_items() -> None:
    t = StreamTranslator()
    t.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_9", "function": {"name": "weather", "arguments": '{"ci'}}]}}]})
    t.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": 1}'}}]},
                         "finish_reason": "tool_calls"}]})
    closing, items = t.finish()
    assert items == [{"type": "function_call", "id": items[0]["id"], "call_id": "call_9", "name": "weather",
                      "arguments": '{"city": 1}', "status": "completed"}]
    for e in closing:
        EVENT.validate_python(e)
