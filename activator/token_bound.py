"""An upper bound on a request's prompt tokens without rendering or encoding it (pure).

Counting a chat exactly means rendering the model's chat template and encoding the
text (about 0.4 ms of the event loop's time per request). Most requests cannot be
refused by their size, so the activator first bounds the count from the request's
bytes and counts exactly only when the bound cannot decide (``activator.service``).

The bound has two halves:

* **The tokenizer's half (proven).** Every tokenizer model ``tokenizers`` has (BPE,
  Unigram, WordPiece, WordLevel) makes at most one token per symbol of its pre-tokenized
  input, a symbol being at least one character, or with byte fallback one byte of an
  unknown character; a byte-level pre-tokenizer maps each byte to one character; an
  added (special) token is one token for a text of at least one byte. So with no
  normalizer and pre-tokenizers that only split, ``tokens <= utf8_bytes(text)``, plus
  what the post-processor adds with ``add_special_tokens``. An NFC normalizer makes at
  most three UTF-8 bytes of one (Unicode's stated maximum expansion of NFC, checked over
  every code point in the tests), and leaves ASCII text as it is. Any other normalizer,
  or a pre-tokenizer that inserts characters (a prefix space, a prepended ``▁``), has no
  bound here: that model is always counted exactly.
* **The template's half (measured).** The rendered text is the request's payload (its
  contents, names, roles, tool calls and tool definitions as JSON) plus the template's
  own text: a fixed part and a part per message, content part, tool call and tool.
  :func:`measure` renders probe conversations with the model's real template when its
  tokenizer is loaded, keeps the largest overhead seen with a margin, and checks that a
  longer payload never adds more than its own bytes and that longer conversations stay
  within the fit; a template that fails these checks has no bound (counted exactly).

So ``bound = factor * (payload_bytes + fixed + per_message * messages + per_part *
parts + per_tool_call * tool_calls + [tools_fixed + per_tool * (tools - 1)]) + added``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from activator.chat_render import Unsupported, tool_dicts

# NFC turns one UTF-8 byte into at most three (e.g. U+1D160, 4 bytes, becomes 12).
NFC_EXPANSION = 3
# Pre-tokenizers that only split (or drop) text; ByteLevel maps a byte to one character.
_SPLITTING_PRE_TOKENIZERS = frozenset({"Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
                                       "BertPreTokenizer", "UnicodeScripts", "CharDelimiterSplit"})
_MODELS = frozenset({"BPE", "Unigram", "WordPiece", "WordLevel"})
# The text part types the renderer keeps (activator.chat_render), and where each keeps it.
_TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
                   "thinking": "thinking"}
# Tool definitions and tool-call arguments are counted as this indented JSON: a
# template's ``tojson`` (compact, or with a smaller indent) is no longer.
JSON_INDENT = 4


def expansion(normalizer: Mapping[str, Any] | None, pre_tokenizer: Mapping[str, Any] | None,
              model_type: str) -> int | None:
    """Tokens per UTF-8 byte of non-ASCII text at most for a tokenizer with these parts
    (their ``tokenizers`` JSON, the model's type name); None: not bounded (count exactly)."""
    if model_type not in _MODELS or not _only_splits(pre_tokenizer):
        return None
    if normalizer is None:
        return 1
    return NFC_EXPANSION if normalizer.get("type") == "NFC" else None


def _only_splits(pre: Mapping[str, Any] | None) -> bool:
    if pre is None:
        return True
    kind = pre.get("type")
    if kind == "Sequence":
        return all(_only_splits(p) for p in pre.get("pretokenizers") or ())
    if kind == "ByteLevel":
        return not pre.get("add_prefix_space", True)
    if kind == "Metaspace":
        return pre.get("prepend_scheme") == "never" and len(str(pre.get("replacement", ""))) == 1
    return kind in _SPLITTING_PRE_TOKENIZERS


@dataclass(frozen=True)
class TemplateOverhead:
    """Bytes a chat template adds to its payload. None in a field: requests with that
    feature are counted exactly (the probes for it did not render)."""

    fixed: int
    per_message: int
    per_part: int | None
    per_tool_call: int | None
    tools_fixed: int | None
    per_tool: int | None
    # The roles whose turns were measured: a turn of another role is counted exactly.
    roles: frozenset[str] = frozenset({"user", "assistant", "system", "developer", "tool"})
    ascii: bool = True  # the template's own text is ASCII (NFC leaves it as it is)


@dataclass(frozen=True)
class PromptBound:
    """What a model's bound needs: its tokenizer's expansion, the tokens its
    post-processor adds (by ``add_special_tokens``) and its template's overhead."""

    expansion: int
    added: Mapping[bool, int]
    overhead: TemplateOverhead | None  # None: chats are counted exactly


@dataclass
class Payload:
    """The bytes a chat request hands its template, and how many of each unit."""

    bytes: int = 0
    messages: int = 0
    parts: int = 0
    tool_calls: int = 0
    tools: int = 0
    ascii: bool = True
    roles: set[str] = field(default_factory=set)

    def text(self, s: str) -> None:
        if s.isascii():
            self.bytes += len(s)
        else:
            self.bytes += len(s.encode("utf-8", "surrogatepass"))
            self.ascii = False

    def json(self, value: Any) -> None:
        self.text(json.dumps(value, ensure_ascii=False, indent=JSON_INDENT))


class _Uncovered(Exception):
    """The request has something the bound does not cover: count it exactly."""


def prompt_bounds(kind: str, body: Mapping[str, Any], bound: PromptBound) -> list[int] | None:
    """An upper bound on each prompt's tokens (as ``ModelTokenizer.prompt_lengths``
    counts them); None where the bound does not cover the request."""
    try:
        if kind == "chat":
            return _chat_bound(body, bound)
        return _completion_bounds(body, bound)
    except _Uncovered:
        return None


def _completion_bounds(body: Mapping[str, Any], bound: PromptBound) -> list[int]:
    if body.get("prompt_embeds") is not None or body.get("suffix") is not None:
        raise _Uncovered
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise _Uncovered
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [len(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise _Uncovered
    out = []
    for p in prompts:
        if isinstance(p, list):
            out.append(len(p))  # token ids: the count itself
        elif isinstance(p, str):
            payload = Payload()
            payload.text(p)
            out.append(_scaled(payload.bytes, payload.ascii, bound.expansion) + bound.added[add_special])
        else:
            raise _Uncovered
    return out


def _chat_bound(body: Mapping[str, Any], bound: PromptBound) -> list[int]:
    over = bound.overhead
    if over is None or not _plain_chat(body):
        raise _Uncovered
    add_special = body.get("add_special_tokens", False)
    if not isinstance(add_special, bool):
        raise _Uncovered
    payload = chat_payload(body)
    if not payload.roles <= over.roles:
        raise _Uncovered
    total = payload.bytes + over.fixed + over.per_message * payload.messages
    for count, per in ((payload.parts, over.per_part), (payload.tool_calls, over.per_tool_call)):
        if count:
            if per is None:
                raise _Uncovered
            total += per * count
    if payload.tools:
        if over.tools_fixed is None or over.per_tool is None:
            raise _Uncovered
        total += over.tools_fixed + over.per_tool * (payload.tools - 1)
    return [_scaled(total, payload.ascii and over.ascii, bound.expansion) + bound.added[add_special]]


def _scaled(n: int, ascii_only: bool, factor: int) -> int:
    return n if ascii_only else n * factor


def _plain_chat(body: Mapping[str, Any]) -> bool:
    """No argument that changes what the template renders beyond the probes' kind."""
    return (body.get("chat_template") is None and not body.get("chat_template_kwargs")
            and body.get("documents") is None and body.get("reasoning_effort") is None
            and body.get("add_generation_prompt", True) is True and not body.get("continue_final_message"))


def chat_payload(body: Mapping[str, Any]) -> Payload:
    """The bytes of what the template receives of ``body`` (``activator.chat_render``'s
    messages and tool definitions). Raises ``_Uncovered`` for what it does not model."""
    messages = body.get("messages")
    tools = body.get("tools")
    if not isinstance(messages, list) or not messages or (tools is not None and not isinstance(tools, list)):
        raise _Uncovered
    payload = Payload()
    for message in messages:
        _message(message, payload)
    try:
        dumped = tool_dicts(tools) or []
    except Unsupported:
        raise _Uncovered from None
    for tool in dumped:  # as the template receives them
        payload.json(tool)
        payload.tools += 1
    return payload


def _message(message: Any, payload: Payload) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message.get("tools"):
        raise _Uncovered
    payload.messages += 1
    payload.roles.add(message["role"])
    payload.text(message["role"])
    content = message.get("content")
    if isinstance(content, str):
        payload.text(content)
    elif isinstance(content, list):
        for part in content:
            payload.text(_part_text(part))
            payload.bytes += 1  # the "\n" that joins parts for a string template
            payload.parts += 1
    elif content is not None:
        raise _Uncovered
    for key in ("name", "task", "tool_call_id", "reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str):
            payload.text(value)
        elif value is not None and key != "name" and key != "task":
            raise _Uncovered
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _Uncovered
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _Uncovered
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args else {}
            except ValueError:
                args = {}
        payload.json({**call, "function": {**function, "arguments": args}})
        payload.tool_calls += 1


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise _Uncovered
    kind = part.get("type")
    if kind == "tool_reference":
        name = part.get("name")
        if isinstance(name, str):
            return name
        raise _Uncovered
    key = _TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
    if key is None:
        raise _Uncovered  # media and other parts: the engine counts them
    text = part.get(key)
    if text is None:
        return ""
    if not isinstance(text, str) or set(part) - {"type", key}:
        raise _Uncovered  # extra keys reach an "openai" template as they are
    return text


def fits(bounds: list[int], max_new: int | None, context: int) -> bool:
    """Whether every prompt, at its bound, and what it may generate fit the context."""
    return max(bounds) + (max_new or 0) <= context


def reservation(kind: str, prompts: list[int], max_new: int | None, n: int, context: int, *,
                upper: bool = False, completions_default: int = 16) -> int:
    """Tokens a request reserves of its tenant's per-minute budget: its prompts, and for
    each sequence what it may generate (``max_new``; without it a chat up to the
    context, a completion ``completions_default``). With ``upper``, ``prompts`` are
    bounds and the result is the largest the exact reservation can be for counts at or
    under them, so a limit that admits it admits the exact one."""
    sequences = n * len(prompts)
    if max_new or kind != "chat":
        return sum(prompts) + sequences * (max_new or completions_default)
    longest = max(prompts)
    if upper:
        # p + n * (context - p) is largest at p = 0 (n >= 1); past the context, p itself.
        return max(n * context, longest)
    return sum(prompts) + sequences * max(context - longest, 0)


# -- measuring a template --------------------------------------------------------------------
Render = Callable[[dict[str, Any]], str]
# Probe text: short, and long with what a template might escape, trim or expand.
_LONG = ' Ünïcødé e\u0301 🚀 "quoted" \\ back\n\t<tag> {brace} \'apos\' \x01 \ue000 '


def _text(i: int, long: bool) -> str:
    return (_LONG * 6 + f"end {i}") if long else f"m{i}"


def _msg(role: str, i: int, long: bool, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": _text(i, long), **extra}


def _call(i: int, long: bool) -> dict[str, Any]:
    args = {"q": _text(i, long), "n": i, "nested": {"k": [_text(i, long), True]}}
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": f"fn_{i}", "arguments": json.dumps(args, ensure_ascii=False)}}


def _tool(i: int, long: bool) -> dict[str, Any]:
    props: dict[str, Any] = {f"p{j}": {"type": "string", "description": _text(j, long)} for j in range(3 if long else 1)}
    if long:
        props["deep"] = {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "integer"}}}}
    return {"type": "function", "function": {"name": f"tool_{i}", "description": _text(i, long),
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": list(props)}}}


_ROLES = ("user", "assistant", "system", "developer", "tool")


def _alternating(k: int, long: bool, system: bool) -> list[dict[str, Any]]:
    head = [_msg("system", 0, long)] if system else []
    return head + [_msg("user" if i % 2 == 0 else "assistant", i + 1, long) for i in range(k)]


def _series(long: bool) -> dict[str, dict[str, Any]]:
    """Probe bodies by name; a series ``name:k`` grows one unit at a time in ``k``."""
    out: dict[str, dict[str, Any]] = {}
    for k in range(1, 7):
        out[f"msgs:{k}"] = {"messages": _alternating(k, long, system=False)}
        out[f"sys:{k}"] = {"messages": _alternating(k, long, system=True)}
    user = _msg("user", 1, long)
    for k in range(1, 4):
        out[f"parts:{k}"] = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": _text(j, long)} for j in range(k)]}]}
        out[f"tools:{k}"] = {"messages": [user], "tools": [_tool(j, long) for j in range(k)]}
    out["tools:0"] = {"messages": [user]}
    for k in range(0, 4):
        calls = [_call(j, long) for j in range(k)]
        assistant = {"role": "assistant", "content": None if k else _text(2, long), **(
            {"tool_calls": calls} if calls else {})}
        results = [{"role": "tool", "tool_call_id": f"call_{j}", "content": _text(j, long)} for j in range(k)]
        out[f"calls:{k}"] = {"messages": [user, assistant, *results, _msg("user", 9, long)]}
    for role in _ROLES:
        for k in range(0, 4):
            if role == "tool":  # tool turns answer an assistant's calls
                head = [user, {"role": "assistant", "content": None, "tool_calls": [_call(j, long) for j in range(3)]}]
                turns = [{"role": "tool", "tool_call_id": f"call_{j}", "content": _text(j, long)} for j in range(k)]
            else:
                head, turns = [user], [_msg(role, j, long) for j in range(k)]
            out[f"role-{role}:{k}"] = {"messages": head + turns}
    out["roles:dev"] = {"messages": [_msg("developer", 0, long), user]}
    out["roles:named"] = {"messages": [_msg("user", 1, long, name=f"n_{_text(1, long)}")]}
    out["roles:reasoning"] = {"messages": [user, _msg("assistant", 2, long, reasoning=_text(3, long)),
                                           _msg("user", 4, long)]}
    return out


def _overheads(render: Render, probes: Mapping[str, dict[str, Any]]) -> dict[str, int]:
    """Rendered bytes less payload bytes, for each probe that renders."""
    out = {}
    for name, body in probes.items():
        try:
            text = render(body)
        except Exception:  # this probe's shape is refused by the template
            continue
        out[name] = len(text.encode("utf-8", "surrogatepass")) - chat_payload(body).bytes
    return out


def _step(over: Mapping[str, int], series: str, ks: range) -> int | None:
    """The largest overhead one more unit of ``series`` adds, None if it did not render."""
    steps = [over[f"{series}:{k + 1}"] - over[f"{series}:{k}"] for k in ks
             if f"{series}:{k}" in over and f"{series}:{k + 1}" in over]
    return max(steps) if steps else None


def _grown(v: int, extra: int = 8) -> int:
    """A measured overhead with the margin kept: a quarter more, and ``extra`` bytes."""
    return math.ceil(max(v, 0) * 1.25) + extra


def _margin(v: int | None) -> int | None:
    return None if v is None else _grown(v)


def measure(render: Render, *, ascii_template: bool = True) -> TemplateOverhead | None:
    """The template's overhead, from probe conversations ``render`` (a body to its
    rendered text, as the engine renders it) turns into text; None when it cannot be
    bounded: a single user turn does not render, a longer payload adds more than its
    own bytes (content rendered twice, or escaped), or longer conversations outgrow
    the fit (an overhead that is not linear in the messages)."""
    probes = _series(False)
    short, long = _overheads(render, probes), _overheads(render, _series(True))
    if "msgs:1" not in short or any(long.get(k, v) > v for k, v in short.items()):
        return None
    role_steps = {role: _step(short, f"role-{role}", range(0, 3)) for role in _ROLES}
    steps = [_step(short, "msgs", range(1, 6)), _step(short, "sys", range(1, 6)), *role_steps.values()]
    per_message = _grown(max([0, *(s for s in steps if s is not None)]))
    first_call = short["calls:1"] - short["calls:0"] if {"calls:0", "calls:1"} <= short.keys() else None
    call_steps = [s for s in (first_call, _step(short, "calls", range(1, 3))) if s is not None]
    # A tool call brings a tool message with it in the probes: its overhead is in the step.
    over = TemplateOverhead(
        fixed=0, per_message=per_message, per_part=_margin(_step(short, "parts", range(1, 3))),
        per_tool_call=_margin(max(call_steps)) if call_steps else None,
        tools_fixed=_margin(short["tools:1"] - short["tools:0"]) if {"tools:0", "tools:1"} <= short.keys() else None,
        per_tool=_margin(_step(short, "tools", range(1, 3))),
        roles=frozenset(role for role, step in role_steps.items() if step is not None), ascii=ascii_template)
    # The fixed part: the most any probe needs beyond its units.
    units = {name: _units(probes[name], over) for name in short}
    fixed = max(v - u for name, v in short.items() if (u := units[name]) is not None)
    over = replace(over, fixed=_grown(fixed, 32))
    return over if _extrapolates(render, over) else None


def _units(body: dict[str, Any], over: TemplateOverhead) -> int | None:
    """A probe's overhead as ``over`` predicts it, less the fixed part (None: not covered)."""
    bound = PromptBound(1, {False: 0, True: 0}, replace(over, ascii=True))
    got = prompt_bounds("chat", body, bound)
    return None if got is None else got[0] - chat_payload(body).bytes


def _extrapolates(render: Render, over: TemplateOverhead) -> bool:
    """Longer conversations than the probes (24 turns, mixed roles) stay within the bound."""
    bound = PromptBound(1, {False: 0, True: 0}, over)
    bodies = [{"messages": _alternating(24, long, system=True)} for long in (False, True)]
    bodies.append({"messages": [m for i in range(1, 8) for m in (
        _msg("user", i, i % 2 == 0), {"role": "assistant", "content": None, "tool_calls": [_call(i, False)]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": _text(i, True)})], "tools": [
        _tool(j, j % 2 == 1) for j in range(5)]})
    for body in bodies:
        try:
            text = render(body)
        except Exception:
            continue
        limit = prompt_bounds("chat", body, bound)
        if limit is not None and len(text.encode("utf-8", "surrogatepass")) > limit[0]:
            return False
    return True
