"""Stable short ids of JSON-ready facts (snapshot fingerprints, engine classes)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Hex digits of an id: 64 bits; a collision is still caught by comparing the inputs.
ID_HEX_CHARS = 16


def json_normal(value: Any) -> Any:
    """``value`` as it comes back from JSON (tuples become lists, keys strings, ...), so
    that a stored copy compares equal to a freshly computed one."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def short_id(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``, shortened to ``ID_HEX_CHARS``."""
    canonical = json.dumps(json_normal(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_HEX_CHARS]


def diff_inputs(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (expected, actual)}`` for every input that differs (absent is None)."""
    keys = sorted(set(expected) | set(actual))
    return {k: (expected.get(k), actual.get(k)) for k in keys if expected.get(k) != actual.get(k)}


def format_diff(diff: dict[str, tuple[Any, Any]]) -> str:
    """``key: ours != theirs`` for a log line or an error message."""
    return "; ".join(f"{k}: {a!r} != {b!r}" for k, (a, b) in diff.items())
