"""OpenAI's Responses API in terms of a chat completion (any vLLM serves one): pure
functions, no I/O.

- :func:`input_items` turns a request's ``input`` (a string, or a list of items) into
  items in one shape: messages with content parts, ``function_call`` and
  ``function_call_output`` items. A malformed item raises :class:`ItemError` naming it.
- :func:`chat_messages` renders instructions, the stored history and the new items
  as chat messages (a function call is an assistant message with ``tool_calls``, its
  output a ``tool`` message).
- :func:`output_items` and :func:`response_usage` take a chat completion's choice and
  usage into a Response's ``output`` and ``usage``.
- :class:`StreamTranslator` takes the chat stream's chunks, one by one, into the
  Responses event stream (``response.created`` ... ``response.completed``), numbered.

Items are plain dicts, as stored and as sent (OpenAI's shapes).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

Item = dict[str, Any]

ROLES = ("user", "assistant", "system", "developer")
# The longest item id a client may give (stored ids are at most this long).
MAX_ID = 100
# Content parts a message item may carry here (text only: no images, files or audio).
TEXT_PARTS = ("input_text", "output_text")


class ItemError(ValueError):
    """A malformed input item; ``param`` names where (``input[2].content``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(value: Any) -> list[Item]:
    """``input`` as a list of items in one shape (ids added where an item has none)."""
    if isinstance(value, str):
        return [message_item("user", value)]
    if not isinstance(value, list) or not value:
        raise ItemError("'input' must be a string or a non-empty list of items", "input")
    return [_item(x, f"input[{i}]") for i, x in enumerate(value)]


def message_item(role: str, text: str, *, item_id: str | None = None) -> Item:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id or new_id("msg"), "role": role, "status": "completed",
            "content": [{"type": part, "text": text}]}


def _item(x: Any, where: str) -> Item:
    if not isinstance(x, dict):
        raise ItemError(f"{where} must be an object", where)
    given = x.get("id")
    if given is not None and (not isinstance(given, str) or not 0 < len(given) <= MAX_ID):
        raise ItemError(f"{where}.id must be a string of 1 to {MAX_ID} characters", f"{where}.id")
    kind = x.get("type", "message")
    if kind == "message":
        role = x.get("role")
        if role not in ROLES:
            raise ItemError(f"{where}.role must be one of {list(ROLES)}", f"{where}.role")
        content = x.get("content")
        if isinstance(content, str):
            return message_item(role, content, item_id=x.get("id"))
        if not isinstance(content, list) or not content:
            raise ItemError(f"{where}.content must be a string or a non-empty list of parts", f"{where}.content")
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") not in TEXT_PARTS or not isinstance(p.get("text"), str):
                raise ItemError(f"{where}.content[{j}] must be a text part ({' or '.join(TEXT_PARTS)} with 'text'): "
                                "this model takes text only", f"{where}.content[{j}]")
            parts.append({"type": p["type"], "text": p["text"]})
        return {"type": "message", "id": x.get("id") or new_id("msg"), "role": role, "status": "completed",
                "content": parts}
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(x.get(name), str):
                raise ItemError(f"{where}.{name} must be a string", f"{where}.{name}")
        return {"type": "function_call", "id": x.get("id") or new_id("fc"), "call_id": x["call_id"],
                "name": x["name"], "arguments": x["arguments"], "status": "completed"}
    if kind == "function_call_output":
        if not isinstance(x.get("call_id"), str) or not isinstance(x.get("output"), str):
            raise ItemError(f"{where} needs 'call_id' and 'output' strings", where)
        return {"type": "function_call_output", "id": x.get("id") or new_id("fco"), "call_id": x["call_id"],
                "output": x["output"], "status": "completed"}
    raise ItemError(f"{where}.type {kind!r} is not supported here: one of message, function_call, "
                    "function_call_output", f"{where}.type")


def text_of(item: Item) -> str:
    return "".join(p["text"] for p in item.get("content", []) if p.get("type") in TEXT_PARTS)


def chat_messages(instructions: str | None, items: Sequence[Item]) -> list[dict[str, Any]]:
    """The chat messages for ``instructions`` (a system message) and ``items`` in order."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": text_of(item)})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools in the chat API's shape (``{"type": "function", "name": ...}`` ->
    ``{"type": "function", "function": {...}}``); others raise :class:`ItemError`."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ItemError("'tools' must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise ItemError(f"tools[{i}]: only function tools ({{'type': 'function', 'name': ...}}) are served "
                            "here", f"tools[{i}]")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """``tool_choice`` in the chat API's shape."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ItemError("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
                    "tool_choice")


def output_items(message: Mapping[str, Any], *, finish_reason: str | None) -> list[Item]:
    """A chat choice's message as output items: its text as one assistant message, each
    tool call as a ``function_call`` item."""
    out: list[Item] = []
    text = message.get("content")
    if text:
        item = message_item("assistant", text)
        if finish_reason == "length":
            item["status"] = "incomplete"
        item["content"][0]["annotations"] = []
        out.append(item)
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        out.append({"type": "function_call", "id": new_id("fc"), "call_id": call.get("id") or new_id("call"),
                    "name": fn.get("name", ""), "arguments": fn.get("arguments") or "", "status": "completed"})
    return out


def response_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The chat usage as a Response's (cached prompt tokens where the engine says)."""
    if not usage:
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def output_text(items: Sequence[Item]) -> str:
    return "".join(text_of(i) for i in items if i["type"] == "message")


class StreamTranslator:
    """The chat stream's chunks (parsed JSON, in order) as Responses events.

    ``start(response)`` gives ``response.created`` and ``response.in_progress`` for the
    response object (status ``in_progress``, no output yet); :meth:`feed` each chunk's
    events; :meth:`finish` the closing ones and the output items, then
    :meth:`completed` the final ``response.completed`` (or ``response.incomplete``) for
    the finished response object (the caller stores it first)."""

    def __init__(self) -> None:
        self.seq = 0
        self.text: list[str] = []
        self.message_id = new_id("msg")
        self._open = False
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self, response: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [self._event("response.created", response=dict(response)),
                self._event("response.in_progress", response=dict(response))]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            text = delta.get("content")
            if text:
                if not self._open:
                    self._open = True
                    item = {"type": "message", "id": self.message_id, "role": "assistant", "status": "in_progress",
                            "content": []}
                    out.append(self._event("response.output_item.added", output_index=0, item=item))
                    out.append(self._event("response.content_part.added", item_id=self.message_id, output_index=0,
                                           content_index=0,
                                           part={"type": "output_text", "text": "", "annotations": []}))
                self.text.append(text)
                out.append(self._event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                       content_index=0, delta=text, logprobs=[]))
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(int(call.get("index", 0)), {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
        return out

    def finish(self) -> tuple[list[dict[str, Any]], list[Item]]:
        """The closing events of the output items, and the items."""
        out: list[dict[str, Any]] = []
        items: list[Item] = []
        if self._open:
            text = "".join(self.text)
            status = "incomplete" if self.finish_reason == "length" else "completed"
            part = {"type": "output_text", "text": text, "annotations": []}
            item = {"type": "message", "id": self.message_id, "role": "assistant", "status": status, "content": [part]}
            out.append(self._event("response.output_text.done", item_id=self.message_id, output_index=0,
                                   content_index=0, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", item_id=self.message_id, output_index=0,
                                   content_index=0, part=part))
            out.append(self._event("response.output_item.done", output_index=0, item=item))
            items.append(item)
        for _, call in sorted(self.calls.items()):
            item = {"type": "function_call", "id": new_id("fc"), "call_id": call["id"] or new_id("call"),
                    "name": call["name"], "arguments": call["arguments"], "status": "completed"}
            index = len(items)
            out.append(self._event("response.output_item.added", output_index=index,
                                   item={**item, "arguments": "", "status": "in_progress"}))
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                   arguments=call["arguments"], name=call["name"]))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
            items.append(item)
        return out, items

    def completed(self, response: Mapping[str, Any]) -> dict[str, Any]:
        kind = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
        return self._event(kind, response=dict(response))

    def error(self, code: str, message: str) -> dict[str, Any]:
        return self._event("error", code=code, message=message, param=None)


def sse(event: Mapping[str, Any]) -> bytes:
    """One event as the Responses stream writes it (``event:`` names its type)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
