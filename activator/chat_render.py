"""A chat request as vLLM 0.32 renders it, up to the text its tokenizer encodes.

The activator's prompt count must be the engine's, so this module follows vLLM's own
code path, step by step, for text-only chats (``vllm/renderers/chat_utils.py``
``parse_chat_messages``; ``vllm/renderers/hf.py`` ``resolve_chat_template_content_format``,
``resolve_chat_template_kwargs``, ``safe_apply_chat_template``;
``ChatCompletionRequest.build_chat_params``; ``OnlineRenderer.preprocess_chat``).
vLLM itself cannot be imported here (it loads torch); ``transformers`` renders the
template, as it does in vLLM.

Whatever this module cannot follow exactly (images and other media, a chat template
sent with the request, a template this tokenizer does not have) makes it answer
``None``: the engine counts that prompt, and answers for it.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

ContentFormat = Literal["string", "openai"]

# vllm/renderers/chat_utils.py: content parts parsed as text, and where each keeps it.
_TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
                   "thinking": "thinking"}
_SKIP_WHEN_NONE = ("text", "refusal")
# _KNOWN_CONTENT_PART_FIELDS (vLLM 0.32): in the "openai" format every other key of a
# text part is kept for the template.
_KNOWN_PART_FIELDS = frozenset({
    "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
    "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
    "video_embeds", "video_url",
})
_CLAUDE_CODE_BILLING_HEADER = "x-anthropic-billing-header"
# Values vLLM's merge_kwargs treats as "not set".
_UNSET = (None, "auto")


class Unsupported(Exception):
    """This request is not one this module renders exactly; the engine counts it."""


# -- the messages --------------------------------------------------------------------------
def conversation(messages: list[dict[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    """``parse_chat_messages`` for text content: the messages the template receives."""
    out = [_message(m, content_format) for m in messages]
    _postprocess(out)
    return out


def _message(message: dict[str, Any], content_format: ContentFormat) -> dict[str, Any]:
    message = dict(message)
    # ChatCompletionRequest._normalize_messages_before: the deprecated name.
    reasoning_content = message.pop("reasoning_content", None)
    if reasoning_content is not None and message.get("reasoning") is None:
        message["reasoning"] = reasoning_content
    role = message["role"]
    content = message.get("content")
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise Unsupported("content")
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [t for t in (_part(p, content_format) for p in parts) if t is not None]
    result: dict[str, Any] = {"role": role,
                              "content": texts if content_format == "openai" else "\n".join(texts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
        if message.get("reasoning") is not None:
            result["reasoning"] = result["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(result["content"], list):
            if any(isinstance(i, dict) and i.get("type") != "text" for i in result["content"]):
                pass  # structured content (tool_reference) stays as it is
            else:
                texts = [i.get("text", "") for i in result["content"] if isinstance(i, dict)]
                result["content"] = "\n".join(texts) if texts else ""
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if isinstance(message.get("task"), str):
        result["task"] = message["task"]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def _part(part: Any, content_format: ContentFormat) -> Any:
    if isinstance(part, str):
        return {"type": "text", "text": part} if content_format == "openai" else part
    if not isinstance(part, dict) or part.get("uuid") is not None:
        raise Unsupported("content part")
    kind = part.get("type")
    if kind == "tool_reference":
        name = part.get("name")
        return {"type": "tool_reference", "name": name} if content_format == "openai" else name
    if kind not in _TEXT_PART_KEYS:
        raise Unsupported(f"content part {kind!r}")  # media: the engine expands it
    text = part.get(_TEXT_PART_KEYS[kind])
    if text is None and kind in _SKIP_WHEN_NONE:
        return None
    if not isinstance(text, str):
        raise Unsupported("content part")
    if content_format == "openai":
        return {"type": "text", "text": text, **{k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}}
    return text


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """vLLM drops Claude Code's per-request attribution line from system text."""
    out = []
    for part in parts:
        text = part if isinstance(part, str) else (
            part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None)
        if not (isinstance(text, str) and text.startswith(_CLAUDE_CODE_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _postprocess(messages: list[dict[str, Any]]) -> None:
    """Tool-call arguments become objects, as templates expect them."""
    for message in messages:
        if message["role"] != "assistant" or not isinstance(message.get("tool_calls"), list):
            continue
        if not message["tool_calls"]:
            del message["tool_calls"]
            continue
        for item in message["tool_calls"]:
            function = item.get("function") if isinstance(item, dict) else None
            if not isinstance(function, dict) or item.get("type", "function") != "function":
                raise Unsupported("tool_calls")  # the engine refuses these
            args = function.get("arguments")
            if args and isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            function["arguments"] = args if isinstance(args, dict) else {}


def developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a template that knows no 'developer' role: developer turns become system
    turns, and all system turns are merged into one, first."""
    converted = []
    for m in messages:
        if m["role"] == "developer":
            m = {k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
        converted.append(m)
    contents: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, m in enumerate(converted):
        if m["role"] != "system":
            rest.append(m)
            continue
        merge = merge or i > 0 or bool(contents)
        content = m.get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] if isinstance(p, dict) else p for p in content
                                if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
        if content:
            contents.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *rest]


def supports_developer_role(template: str) -> bool:
    return '"developer"' in template or "'developer'" in template


# -- the template's arguments --------------------------------------------------------------
def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """``[tool.model_dump() for tool in request.tools]``: the fields vLLM models, in its order."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise Unsupported("tools")
        function = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        defer = tool.get("defer_loading")
        for key, value in (("strict", fn.get("strict")),
                           ("defer_loading", fn.get("defer_loading") if fn.get("defer_loading") is not None
                            else defer)):
            if value is not None:
                function[key] = value
        dumped: dict[str, Any] = {"type": "function", "function": function}
        if defer is not None:
            dumped["defer_loading"] = defer
        out.append(dumped)
    return out


def template_kwargs(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The keyword arguments vLLM passes to the template (before its own filtering):
    the server's defaults (tools), then the request's ``chat_template_kwargs``, then
    the request's own template fields, each merge skipping unset values."""
    user = body.get("chat_template_kwargs") or {}
    if not isinstance(user, dict) or {"chat_template", "tokenize"} & user.keys():
        raise Unsupported("chat_template_kwargs")  # the engine refuses these
    extra = {
        "add_generation_prompt": body.get("add_generation_prompt", True),
        "continue_final_message": body.get("continue_final_message", False),
        "documents": body.get("documents"),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = body["reasoning_effort"] != "none"
    request_kwargs = _merge(user, extra)
    return _merge({"tools": tools}, request_kwargs)


def _merge(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in defaults.items() if v not in _UNSET} | {
        k: v for k, v in overrides.items() if v not in _UNSET}


def accepted_kwargs(template: str, kwargs: dict[str, Any], apply_params: frozenset[str]) -> dict[str, Any]:
    """``resolve_chat_template_kwargs``: only what the template reads, or what
    ``apply_chat_template`` takes by name, reaches it."""
    accept = (apply_params | template_variables(template)) - {"chat_template", "tokenize"}
    return {k: v for k, v in kwargs.items() if k in accept}


class _AssistantTracker(jinja2.ext.Extension):
    # transformers' {% generation %} tag, parsed only (vLLM does the same).
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)


@lru_cache(maxsize=32)
def template_variables(template: str) -> frozenset[str]:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_AssistantTracker, jinja2.ext.loopcontrols])
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


# -- the content format: does the template loop over a message's content parts? -----------
@lru_cache(maxsize=32)
def content_format(template: str) -> ContentFormat:
    """vLLM's ``_detect_content_format``: "openai" when the template iterates over a
    message's content (parts stay objects), else "string" (text parts joined by "\\n")."""
    import transformers.utils.chat_template_utils as hf_chat

    try:
        ast = hf_chat._compile_jinja_template(template).environment.parse(template)
        loop = next(_content_loops(ast), None)
    except Exception:  # vLLM reads a template it cannot analyse as "string" too
        return "string"
    return "string" if loop is None else "openai"


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_var_or_elems(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _name_of(target: jinja2.nodes.Node) -> str:
    # vLLM asserts this; a template where it fails is read as "string".
    if not isinstance(target, jinja2.nodes.Name):
        raise TypeError("not a plain name")
    return target.name


def _assigned_from(root: jinja2.nodes.Node, name: str) -> Iterator[str]:
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems(assign.node, current):
                target = _name_of(assign.target)
                yield target
                if target != current:
                    pending.append(target)


def _message_vars(root: jinja2.nodes.Node) -> Iterator[str]:
    names = list(_assigned_from(root, "messages"))
    for loop in root.find_all(jinja2.nodes.For):
        for name in names:
            if _is_var_or_elems(loop.iter, name):
                yield _name_of(loop.target)
                break


def _content_loops(root: jinja2.nodes.Node) -> Iterator[str]:
    message_vars = list(_message_vars(root))
    # Macro parameters that receive message.content, whatever they are called.
    params_by_loop: dict[int, set[str]] = {}
    loops_in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(_is_var_or_elems(arg, v, "content") for v in message_vars):
                    content_params.add(macro.args[i].name)
            for kw in call.kwargs:
                if (isinstance(kw, jinja2.nodes.Keyword) and kw.key in param_names
                        and any(_is_var_or_elems(kw.value, v, "content") for v in message_vars)):
                    content_params.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            loops_in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems(loop.iter, v, "content") for v in message_vars):
            yield _name_of(loop.target)
        elif isinstance(loop.iter, jinja2.nodes.Name) and (
            loop.iter.name in params_by_loop.get(id(loop), ())
            or (id(loop) not in loops_in_macros and loop.iter.name == "content")
        ):
            yield _name_of(loop.target)
