"""Which ready replica serves a request: prefix affinity with a bound on load.

Requests that share a prompt prefix (a shared system prompt, the conversation so far)
should land on the replica whose engine already holds that prefix in its KV cache. Each
prefix key ranks the replicas by rendezvous hashing (stable as replicas come and go);
the request goes to the first one in that order whose outstanding requests stay within
ceil((1 + epsilon) x the mean), counting this request — consistent hashing with bounded
loads. Without a key: least outstanding.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any, Protocol

DEFAULT_EPSILON = 0.25
# How much of the conversation forms the key: enough to tell system prompts and
# conversations apart, short enough that a growing conversation keeps its key.
PREFIX_CHARS = 1024


class HasLoad(Protocol):
    url: str
    outstanding: int


def prefix_key(kind: str, body: dict[str, Any]) -> str | None:
    """A key for the part of the prompt that successive requests share."""
    if kind == "chat":
        msgs = body.get("messages") or []
        # The opening of the conversation (system prompt and first user turn): every
        # later turn of the same conversation starts with it, so they share a key and
        # find their earlier turns in that replica's prefix cache.
        text = json.dumps(msgs[:2], sort_keys=True, ensure_ascii=False)
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    if not text:
        return None
    return hashlib.blake2b(text[:PREFIX_CHARS].encode(), digest_size=8).hexdigest()


def _rank(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(), "big")


def choose(replicas: Sequence[HasLoad], key: str | None, epsilon: float = DEFAULT_EPSILON) -> HasLoad | None:
    """The replica for a request with prefix ``key`` (pure; loads are read, not changed)."""
    if not replicas:
        return None
    least = min(replicas, key=lambda r: (r.outstanding, r.url))
    if key is None:
        return least
    total = sum(r.outstanding for r in replicas) + 1
    # Rounded up, so that at low load (one request on idle replicas) the key's own
    # replica always qualifies.
    bound = math.ceil((1 + epsilon) * total / len(replicas))
    for r in sorted(replicas, key=lambda r: _rank(key, r.url), reverse=True):
        if r.outstanding + 1 <= bound:
            return r
    return least
