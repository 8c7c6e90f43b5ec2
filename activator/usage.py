"""Usage from the engine's answers, without changing the bytes the client gets.

The activator always asks the engine for usage (``stream_options.include_usage``). A
stream is cut into SSE events; every event is forwarded unchanged except the engine's
usage-only chunk, which is forwarded only when the client asked for it. Non-streamed
answers carry ``usage`` in the body.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # 'engine' once the engine reported counts; 'estimated' from streamed chunks; 'none'.
    source: str = "none"
    # Why each choice ended (stop, length, tool_calls...), where the answer was read for
    # it (a whole answer; a stream when it is traced: ``StreamTap.finish_reasons``).
    finish_reasons: list[str] = field(default_factory=list)

    def take(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens = int(details.get("cached_tokens") or 0)
        self.source = "engine"


def usage_from_body(body: bytes, usage: Usage) -> None:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return
    if isinstance(data, dict) and isinstance(data.get("usage"), dict):
        usage.take(data["usage"])
    if isinstance(data, dict) and isinstance(data.get("choices"), list):
        usage.finish_reasons = [c["finish_reason"] for c in data["choices"]
                                if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]


DONE = b"data: [DONE]"
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]{1,32})"')


class StreamTap:
    """Feed upstream bytes in; get the bytes to send out, event by event."""

    def __init__(self, usage: Usage, forward_usage_chunk: bool, *, finish_reasons: bool = False) -> None:
        """``finish_reasons``: look for them in the chunks (into ``usage``), which costs a
        search of every chunk: only for a traced request."""
        self.usage = usage
        self.forward_usage_chunk = forward_usage_chunk
        self.finish_reasons = finish_reasons
        self._buf = b""
        self.content_chunks = 0
        self.saw_done = False

    def feed(self, data: bytes) -> list[bytes]:
        """Complete events (each with its trailing blank line) to forward, in order.

        Token chunks, all but the usage chunk and ``[DONE]`` at the end, are forwarded
        as one piece and counted without splitting them into events: an event's
        ``"choices"`` key cannot occur inside a JSON string, where quotes are escaped."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        whole = buf[: end + 2]
        self._buf = buf[end + 2:]
        if self.finish_reasons and b'"finish_reason":' in whole:
            self.usage.finish_reasons += [r.decode() for r in _FINISH.findall(whole)]
        # Up to the first event that needs a look (the usage chunk, [DONE]): one piece.
        marks = [i for i in (whole.find(b'"usage"'), whole.find(b"[DONE]")) if i >= 0]
        head = len(whole) if not marks else whole.rfind(b"\n\n", 0, min(marks)) + 2
        out = []
        if head > 1:
            piece = whole[:head]
            content = piece.count(b'"choices"') - len(_NO_CHOICES.findall(piece))
            if content > 0:
                self._count_content(content)
            out.append(piece)
        else:
            head = 0
        if head < len(whole):
            self._events(whole, head, out)
        return out

    def _events(self, buf: bytes, start: int, out: list[bytes]) -> None:
        """The events of ``buf`` from ``start``, one by one, each forwarded or not."""
        while True:
            # SSE events end with a blank line; vLLM uses "\n\n".
            idx = buf.find(b"\n\n", start)
            if idx < 0:
                break
            event = buf[start: idx + 2]
            start = idx + 2
            if self._keep(event):
                out.append(event)

    def flush(self) -> bytes:
        """Whatever is left (an unterminated event) at the end of the stream."""
        rest, self._buf = self._buf, b""
        return rest

    def _keep(self, event: bytes) -> bool:
        line = event.strip()
        if line == DONE:
            self.saw_done = True
            return True
        if not line.startswith(b"data: "):
            return True
        if b'"usage"' not in line:
            # The common case, a token chunk: counted without parsing it.
            if b'"choices"' in line and not _NO_CHOICES.search(line):
                self._count_content()
            return True
        try:
            chunk = json.loads(line[6:])
        except (json.JSONDecodeError, UnicodeDecodeError):
            return True
        if not isinstance(chunk, dict):
            return True
        if isinstance(chunk.get("usage"), dict):
            self.usage.take(chunk["usage"])
            if not chunk.get("choices"):
                # The usage-only chunk the activator asked for on the client's behalf.
                return self.forward_usage_chunk
        if chunk.get("choices"):
            self._count_content()
        return True

    def _count_content(self, chunks: int = 1) -> None:
        self.content_chunks += chunks
        if self.usage.source != "engine":
            # Until (unless) the engine reports usage, count what streamed: vLLM
            # sends one token per chunk unless it batches, so this is an estimate.
            self.usage.completion_tokens = self.content_chunks
            self.usage.source = "estimated"
