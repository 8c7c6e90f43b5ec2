"""The prompt bound (activator/token_bound.py): never below the exact count, over
generated chats and every chat template Thaw ships or its tests use, and what it
refuses to bound (counted exactly instead)."""

from __future__ import annotations

import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activator.token_bound import (
    NFC_EXPANSION,
    PromptBound,
    TemplateOverhead,
    expansion,
    fits,
    measure,
    prompt_bounds,
    reservation,
)
from activator.tokens import PromptRejected
from tests.activator.chat_templates import TEMPLATES, tokenizer
from thaw.demo_tokenizer import CHAT_TEMPLATE

# -- generated chats ---------------------------------------------------------------------------
texts = st.text(max_size=40) | st.text(alphabet="🚀😀ÄÖ€中文\u0301\n\t\"\\<>{} ab", max_size=300)
# Mostly the roles templates know; now and then another (counted exactly).
roles = st.integers(0, 9).flatmap(lambda i: st.text(min_size=1, max_size=8) if i == 0 else st.sampled_from(
    ["system", "user", "assistant", "tool", "developer"]))
json_values = st.recursive(st.none() | st.booleans() | st.integers() | texts,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                           max_leaves=8)
parts = st.one_of(
    texts,
    st.builds(lambda k, t: {"type": k, "text": t}, st.sampled_from(["text", "input_text", "output_text"]), texts),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, texts),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, texts),
)
tool_calls = st.lists(st.builds(
    lambda i, name, args: {"id": f"call_{i}", "type": "function",
                           "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}},
    st.integers(0, 99), texts, st.dictionaries(texts, json_values, max_size=4)), max_size=3)
tools = st.lists(st.builds(
    lambda name, desc, props: {"type": "function", "function": {
        "name": name, "description": desc, "parameters": {"type": "object", "properties": props}}},
    texts, texts | st.none(), st.dictionaries(texts, json_values, max_size=4)), max_size=3)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(roles)
    message: dict[str, Any] = {"role": role, "content": draw(texts | st.lists(parts, max_size=4) | st.none())}
    if draw(st.booleans()):
        message["name"] = draw(texts)
    if role == "assistant":
        calls = draw(tool_calls)
        if calls:
            message["tool_calls"] = calls
        if draw(st.booleans()):
            message["reasoning"] = draw(texts)
    if role == "tool":
        message["tool_call_id"] = draw(texts)
    return message


chats = st.builds(lambda ms, ts: {"messages": ms, **({"tools": ts} if ts else {})},
                  st.lists(messages(), min_size=1, max_size=8), tools)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_bound_is_never_below_the_exact_count(demo_model_dir: Path, name: str) -> None:
    tok = tokenizer(demo_model_dir, TEMPLATES[name])
    assert tok.bound is not None and tok.bound.overhead is not None, "every template here is bounded"
    added = tok.bound.added
    decided = []

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(chats, st.booleans())
    def check(body: dict[str, Any], add_special: bool) -> None:
        if name == "strict":  # it refuses any other first turn
            body["messages"][0]["role"] = "user"
        body = {**body, "add_special_tokens": add_special}
        try:
            exact = tok.prompt_lengths("chat", body)
        except PromptRejected:
            return
        bound = tok.prompt_bounds("chat", body)
        if exact is not None and bound is not None:
            decided.append(1)
            assert bound[0] >= exact[0], (bound, exact)
            # The template's half on its own: the bound covers the rendered bytes (the
            # demo tokenizer's factor is 1), whatever the tokenizer makes of them.
            text, add_special = tok.render_chat(body)
            assert bound[0] >= len(text.encode()) + added[add_special]

    check()
    assert len(decided) > 30  # the bound answered for most of them: the property was tested


def agent_chat(turns: int) -> dict[str, Any]:
    """A long agent conversation: every turn a tool call and its result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}]
    return {"messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}]}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("body", [
    agent_chat(60),
    {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(101)]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 50}]},
], ids=["agent-60-calls", "101-short-turns", "50-parts"])
def test_long_conversations_of_short_turns_stay_bounded(demo_model_dir: Path, name: str, body: dict[str, Any]) -> None:
    # Short turns are where the template's own text is most of the prompt.
    tok = tokenizer(demo_model_dir, TEMPLATES[name])
    bound = tok.prompt_bounds("chat", body)
    try:
        text, _ = tok.render_chat(body)
    except PromptRejected:
        return
    assert bound is not None and bound[0] >= len(text.encode())


@given(st.lists(texts, min_size=1, max_size=4) | texts, st.booleans())
@settings(max_examples=200, deadline=None, derandomize=True)
def test_completion_prompts_are_bounded_by_their_bytes(demo_model_dir: Path, prompt: Any, add_special: bool) -> None:
    tok = tokenizer(demo_model_dir, CHAT_TEMPLATE)
    body = {"prompt": prompt, "add_special_tokens": add_special}
    exact, bound = tok.prompt_lengths("completions", body), tok.prompt_bounds("completions", body)
    assert exact is not None and bound is not None
    assert all(b >= e for b, e in zip(bound, exact, strict=True))


def test_nfc_makes_at_most_three_bytes_of_one() -> None:
    # Over every code point (composition across characters only shortens the text).
    worst = max(len(unicodedata.normalize("NFC", chr(c)).encode()) / len(chr(c).encode())
                for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    assert worst == NFC_EXPANSION


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


@pytest.mark.parametrize(("normalizer", "pre_tokenizer", "model", "expected"), [
    (None, BYTE_LEVEL, "BPE", 1),  # the demo model, Llama 3, GPT-2: a token per byte at most
    ({"type": "NFC"}, {"type": "Sequence", "pretokenizers": [{"type": "Split"}, BYTE_LEVEL]}, "BPE", 3),  # Qwen 2
    (None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"}, "Unigram", 1),
    (None, None, "WordPiece", 1),
    # A prepended "▁" or prefix space: one more character than the text had.
    ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]}, None, "BPE", None),
    (None, {**BYTE_LEVEL, "add_prefix_space": True}, "BPE", None),
    (None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}, "Unigram", None),
    ({"type": "NFKC"}, BYTE_LEVEL, "BPE", None),  # "ﷺ" (3 bytes) is 18 characters in NFKC
    (None, BYTE_LEVEL, "SomeFutureModel", None),
])
def test_which_tokenizers_are_bounded(normalizer: Any, pre_tokenizer: Any, model: str, expected: int | None) -> None:
    assert expansion(normalizer, pre_tokenizer, model) == expected


def test_the_demo_tokenizer_is_bounded_at_a_token_per_byte(demo_model_dir: Path) -> None:
    tok = tokenizer(demo_model_dir, CHAT_TEMPLATE)
    assert tok.bound is not None and tok.bound.expansion == 1
    assert dict(tok.bound.added) == {False: 0, True: 1}  # BOS with add_special_tokens


def test_a_tokenizer_that_can_make_more_tokens_than_bytes_is_always_counted(demo_model_dir: Path) -> None:
    # A prepended "▁": "a" (1 byte) may be two tokens, "▁" and "a".
    from activator.tokens import TOKENIZER_FILES, build_tokenizer

    files = {name: (demo_model_dir / name).read_bytes() for name in TOKENIZER_FILES if (demo_model_dir / name).exists()}
    spec = json.loads(files["tokenizer.json"])
    files["tokenizer.json"] = json.dumps({**spec, "normalizer": {"type": "Prepend", "prepend": "▁"}}).encode()
    tok = build_tokenizer(files)
    assert tok.bound is None
    body = {"messages": [{"role": "user", "content": "a"}]}
    assert tok.prompt_bounds("chat", body) is None and tok.prompt_lengths("chat", body)


def render_with(template: str) -> Any:
    import jinja2

    env = jinja2.Environment()
    return lambda body: env.from_string(template).render(messages=body["messages"], tools=body.get("tools"))


@pytest.mark.parametrize("template", [
    # Every earlier turn's role again at each turn: not linear in the messages.
    "{% for m in messages %}{% for p in messages[:loop.index] %}{{ p.role }}:{% endfor %}{{ m.content }}"
    "{% endfor %}",
    # The content twice: a longer content adds more than its own bytes.
    "{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}",
    # Content as JSON: escaped, longer than its bytes.
    "{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
])
def test_a_template_whose_overhead_is_not_bounded_is_counted_exactly(template: str) -> None:
    assert measure(render_with(template)) is None


def test_a_template_that_cannot_render_one_user_turn_is_counted_exactly() -> None:
    def render(body: dict[str, Any]) -> str:
        raise ValueError("no")

    assert measure(render) is None


DEMO = PromptBound(1, {False: 0, True: 1}, TemplateOverhead(fixed=87, per_message=68, per_part=8, per_tool_call=8,
                                                            tools_fixed=8, per_tool=8))


@pytest.mark.parametrize(("body", "expected"), [
    # 87 + 68 * 1 + len("user") 4 + len("hi") 2 = 161
    ({"messages": [{"role": "user", "content": "hi"}]}, [161]),
    # "é" is 2 bytes: 87 + 68 + 4 + 2 = 161 (no NFC: factor 1)
    ({"messages": [{"role": "user", "content": "é"}]}, [161]),
    # two parts: 2 + 2 bytes, 1 "\n" each, 8 each: 87 + 68 + 4 + 6 + 16 = 181
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "ab"}, "cd"]}]}, [181]),
    # + BOS with add_special_tokens: 161 + 1
    ({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True}, [162]),
    # completions: bytes + BOS, token ids as they are
    ({"prompt": ["hello", [1, 2, 3]]}, [6, 3]),
    # what the bound does not cover: counted exactly
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": True}}, None),
    ({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}, None),
    ({"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 1 }}"}, None),
])
def test_the_bound_shows_its_arithmetic(body: dict[str, Any], expected: list[int] | None) -> None:
    kind = "completions" if "prompt" in body else "chat"
    assert prompt_bounds(kind, body, DEMO) == expected


def test_nfc_triples_non_ascii_text_only() -> None:
    nfc = PromptBound(3, {False: 0, True: 1}, DEMO.overhead)
    assert prompt_bounds("chat", {"messages": [{"role": "user", "content": "hi"}]}, nfc) == [161]
    assert prompt_bounds("chat", {"messages": [{"role": "user", "content": "é"}]}, nfc) == [161 * 3]


@pytest.mark.parametrize(("kind", "prompts", "max_new", "n", "upper", "expected"), [
    ("chat", [100], 50, 2, False, 200),        # 100 + 2 * 50
    ("chat", [100], None, 1, False, 1000),     # 100 + (1000 - 100): the whole context
    ("chat", [100], None, 1, True, 1000),      # the same at any count under the bound
    ("chat", [100], None, 3, False, 2800),     # 100 + 3 * (1000 - 100)
    ("chat", [100], None, 3, True, 3000),      # 3 * 1000: the most for a count of 0..100
    ("completions", [10, 20], None, 2, True, 94),  # 30 + 2 * 2 * 16
])
def test_reservation(kind: str, prompts: list[int], max_new: int | None, n: int, upper: bool, expected: int) -> None:
    assert reservation(kind, prompts, max_new, n, 1000, upper=upper) == expected


def test_fits() -> None:
    assert fits([900], 100, 1000) and not fits([901], 100, 1000) and fits([10, 1000], None, 1000)
