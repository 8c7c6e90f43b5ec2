"""vLLM's chat rendering steps, as the activator follows them (no engine needed).

The agreement with the engine itself is tests/test_e2e_prompt_tokens.py; these tables
pin the rules that the demo model's template cannot show (it never loops over content).
"""

from __future__ import annotations

from typing import Any

import pytest

from activator.chat_render import (
    Unsupported,
    content_format,
    conversation,
    developer_as_system,
    template_kwargs,
    tool_dicts,
)


@pytest.mark.parametrize(("template", "expected"), [
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
    ("{% for m in messages %}{{ m.content | trim }}{% endfor %}", "string"),
    ("{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}", "openai"),
    ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    # Through an assignment of the messages, and through a loop over `content`.
    ("{% set msgs = messages %}{% for m in msgs %}{% set content = m.content %}"
     "{% for p in content %}{{ p }}{% endfor %}{% endfor %}", "openai"),
    # Through a macro parameter with another name.
    ("{% macro render(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{{ render(m.content) }}{% endfor %}", "openai"),
    ("{% for m in messages %}{{ m['content'] ", "string"),  # not a template: vLLM's default
])
def test_content_format_is_detected_from_the_template(template: str, expected: str) -> None:
    assert content_format(template) == expected


PARTS = [{"type": "text", "text": "a"}, "b", {"type": "text", "text": None}, {"type": "text", "text": "c",
                                                                            "cache_control": {"type": "x"}}]


def test_text_parts_are_joined_for_string_templates_and_kept_for_openai_ones() -> None:
    msgs = [{"role": "user", "content": PARTS}]
    # A part whose text is null is skipped; "\n" joins the rest.
    assert conversation(msgs, "string") == [{"role": "user", "content": "a\nb\nc"}]
    assert conversation(msgs, "openai") == [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
        {"type": "text", "text": "c", "cache_control": {"type": "x"}}]}]


def test_messages_become_what_vllm_hands_the_template() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    bad = {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "x-anthropic-billing-header: cch=9\nBe brief.", "extra": 1},
        {"role": "assistant", "content": None, "tool_calls": [call, bad], "reasoning_content": "hmm"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
        {"role": "user", "content": "", "name": "ada"},
        {"role": "assistant", "content": "ok", "tool_calls": []},
    ]
    assert conversation(msgs, "string") == [
        {"role": "system", "content": "Be brief."},  # the billing line dropped, unknown keys too
        {"role": "assistant", "content": "", "reasoning": "hmm", "reasoning_content": "hmm",
         "tool_calls": [{**call, "function": {"name": "f", "arguments": {"x": 1}}},
                        {**bad, "function": {"name": "f", "arguments": {}}}]},  # not an object: {}
        {"role": "tool", "content": "r1\nr2", "tool_call_id": "c1"},
        {"role": "user", "content": "", "name": "ada"},
        {"role": "assistant", "content": "ok"},  # no tool calls: none at all
    ]
    assert call["function"]["arguments"] == '{"x": 1}'  # the request itself is untouched


@pytest.mark.parametrize("content", [
    [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
    [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
    [{"type": "text", "text": "a", "uuid": "u1"}],
    [{"text": "no type"}],
    {"text": "not a list"},
])
def test_media_and_odd_parts_are_left_to_the_engine(content: Any) -> None:
    with pytest.raises(Unsupported):
        conversation([{"role": "user", "content": content}], "string")


def test_developer_turns_become_one_system_turn_for_templates_without_them() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "developer", "content": "D", "tools": None}]
    assert developer_as_system(msgs) == [{"role": "system", "content": "S\n\nD"}, {"role": "user", "content": "U"}]
    # A lone system turn first is left as it is.
    assert developer_as_system(msgs[:2]) == msgs[:2]


@pytest.mark.parametrize(("body", "expected"), [
    ({}, {"add_generation_prompt": True, "continue_final_message": False}),
    # The request's own fields win over its chat_template_kwargs; unset values are dropped.
    ({"chat_template_kwargs": {"add_generation_prompt": False, "x": None, "y": "auto", "z": 1}},
     {"add_generation_prompt": True, "continue_final_message": False, "z": 1}),
    ({"add_generation_prompt": False, "documents": [{"title": "t", "text": "x"}]},
     {"add_generation_prompt": False, "continue_final_message": False, "documents": [{"title": "t", "text": "x"}]}),
    # A reasoning effort switches thinking on (off for "none") unless the kwargs say.
    ({"reasoning_effort": "low"}, {"add_generation_prompt": True, "continue_final_message": False,
                                   "reasoning_effort": "low", "enable_thinking": True}),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
     {"add_generation_prompt": True, "continue_final_message": False, "reasoning_effort": "none",
      "enable_thinking": True}),
])
def test_template_arguments_merge_as_vllm_merges_them(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert template_kwargs(body, None) == expected


def test_tools_are_what_vllm_dumps_of_them() -> None:
    tools = [{"type": "function", "x": 1, "function": {"name": "f", "parameters": {"type": "object"}, "y": 2}},
             {"type": "function", "function": {"name": "g", "description": "G", "strict": True},
              "defer_loading": True}]
    assert tool_dicts(tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": "G", "parameters": None, "strict": True,
                                          "defer_loading": True}, "defer_loading": True},
    ]
    assert template_kwargs({}, tool_dicts(tools))["tools"] == tool_dicts(tools)
