"""Bounds on what one request may make the activator hold or walk: its headers and the
shape of its JSON body (pure; the ASGI layer in ``activator.edge`` and ``read_json``
in ``activator.service`` apply them).

Each check is linear in the request and cheap for an ordinary one: the JSON walk runs
only when the raw body could break a bound at all (more opening brackets than the depth
limit, more bytes than the string limit, since a string has at most as many characters
as bytes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from activator.errors import BadRequest, HeadersTooLarge
from thaw.config import Server

# A header line on the wire: name, ": ", value, CRLF.
_LINE_OVERHEAD = 4


@dataclass(frozen=True)
class RequestBounds:
    max_header_count: int = 100
    max_header_bytes: int = 16 * 1024
    max_header_line_bytes: int = 8 * 1024
    max_json_depth: int = 32
    max_json_string_chars: int = 1024 * 1024

    @classmethod
    def from_server(cls, server: Server) -> RequestBounds:
        return cls(server.max_header_count, server.max_header_bytes, server.max_header_line_bytes,
                   server.max_json_depth, server.max_json_string_chars)


def check_headers(headers: Iterable[tuple[bytes, bytes]], bounds: RequestBounds) -> None:
    """Raise ``HeadersTooLarge`` (431) for too many headers, too many header bytes in
    all, or one header line too long."""
    count = total = 0
    for name, value in headers:
        line = len(name) + len(value) + _LINE_OVERHEAD
        if line > bounds.max_header_line_bytes:
            shown = name[:64].decode("latin-1")
            raise HeadersTooLarge(f"the header {shown!r} is {line} bytes; the limit is "
                                  f"{bounds.max_header_line_bytes} per header")
        count += 1
        total += line
    if count > bounds.max_header_count:
        raise HeadersTooLarge(f"the request has {count} headers; the limit is {bounds.max_header_count}")
    if total > bounds.max_header_bytes:
        raise HeadersTooLarge(f"the request's headers are {total} bytes; the limit is {bounds.max_header_bytes}")


def parse_json(raw: bytes, bounds: RequestBounds) -> Any:
    """``raw`` parsed, or ``BadRequest``: not JSON (``param`` None), nested deeper than
    ``max_json_depth`` (code ``json_too_deep``), or with a string (a key or a value) of
    more than ``max_json_string_chars`` characters (``string_too_long``, ``param`` its
    path, e.g. ``messages.0.content``)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        # json's scanner recurses per level (a "[[[[...": about 1000 deep): refused here
        # as the same error the walk below gives for shallower excess.
        raise _too_deep(bounds, None) from None
    check_json(raw, body, bounds)
    return body


def check_json(raw: bytes, body: Any, bounds: RequestBounds) -> None:
    """Walk ``body`` (parsed from ``raw``) with an explicit stack, if ``raw`` could break
    a bound at all."""
    deep = raw.count(b"[") + raw.count(b"{") > bounds.max_json_depth
    long = len(raw) > bounds.max_json_string_chars
    if not (deep or long):
        return
    max_depth, max_chars = bounds.max_json_depth, bounds.max_json_string_chars
    # (value, depth of the containers around it, its key, the entry of its container):
    # the path is rebuilt only for the error.
    stack: list[_Entry] = [(body, 0, None, None)]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        if isinstance(value, str):
            if len(value) > max_chars:
                raise BadRequest(f"a string in the request body has {len(value)} characters; the limit is "
                                 f"{max_chars}", param=_path(entry), code="string_too_long")
        elif isinstance(value, dict):
            if depth >= max_depth:
                raise _too_deep(bounds, _path(entry))
            for k, v in value.items():
                if len(k) > max_chars:
                    raise BadRequest(f"a key in the request body has {len(k)} characters; the limit is "
                                     f"{max_chars}", param=_path(entry), code="string_too_long")
                stack.append((v, depth + 1, k, entry))
        elif isinstance(value, list):
            if depth >= max_depth:
                raise _too_deep(bounds, _path(entry))
            stack.extend((v, depth + 1, i, entry) for i, v in enumerate(value))


_Entry = tuple[Any, int, "str | int | None", Any]


def _path(entry: _Entry | None) -> str | None:
    keys: list[str] = []
    while entry is not None and entry[2] is not None:
        keys.append(str(entry[2]))
        entry = entry[3]
    return ".".join(reversed(keys)) or None


def _too_deep(bounds: RequestBounds, param: str | None) -> BadRequest:
    return BadRequest(f"the request body nests arrays and objects more than {bounds.max_json_depth} deep",
                      param=param, code="json_too_deep")
