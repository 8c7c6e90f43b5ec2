"""Per-tenant, per-model admission limits as token buckets (pure; time passed in).

A tenant's ``limits`` apply to each model it uses: requests per minute, tokens per
minute (prompt tokens + the requested max tokens, reconciled with the real usage when
the answer ends) and concurrent requests. Over a limit: 429 with ``Retry-After`` and
OpenAI's ``x-ratelimit-*`` headers, which successful answers carry too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from activator.errors import TooManyRequests
from thaw.config import RateLimits


@dataclass
class Bucket:
    """``capacity`` tokens, refilled continuously at ``capacity`` per minute."""

    capacity: float
    level: float
    updated: float

    @classmethod
    def full(cls, capacity: float, now: float) -> Bucket:
        return cls(capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.capacity / 60.0)
            self.updated = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 if it is now)."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.capacity

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level) * 60.0 / self.capacity


@dataclass
class _Entry:
    requests: Bucket | None
    tokens: Bucket | None
    concurrent: int = 0


@dataclass(frozen=True)
class Admission:
    """A granted request: what it reserved, to settle when it ends."""

    key: tuple[str, str]
    reserved_tokens: int
    headers: dict[str, str] = field(default_factory=dict)


def _fmt(seconds: float) -> str:
    # OpenAI writes durations like "1s", "6m0s", "20ms".
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 0)}ms"
    s = math.ceil(seconds)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


class RateLimiter:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    def _entry(self, key: tuple[str, str], limits: RateLimits, now: float) -> _Entry:
        e = self._entries.get(key)
        if e is None:
            e = _Entry(
                Bucket.full(limits.requests_per_minute, now) if limits.requests_per_minute else None,
                Bucket.full(limits.tokens_per_minute, now) if limits.tokens_per_minute else None,
            )
            self._entries[key] = e
        for b in (e.requests, e.tokens):
            if b:
                b.refill(now)
        return e

    def admit(self, tenant: str, model: str, limits: RateLimits, tokens: int, now: float) -> Admission:
        """Take one request and ``tokens`` from the buckets, or raise 429 taking nothing."""
        key = (tenant, model)
        e = self._entry(key, limits, now)
        if e.tokens and tokens > e.tokens.capacity:
            raise TooManyRequests(
                f"this request needs {tokens} tokens (prompt + max tokens), more than the tenant's limit of "
                f"{int(e.tokens.capacity)} tokens per minute; lower max_tokens",
                code="tokens_exceeded", headers=self.headers(e),
            )
        waits = []
        if limits.max_concurrent_requests and e.concurrent >= limits.max_concurrent_requests:
            raise TooManyRequests(
                f"too many concurrent requests for model {model!r}: the limit is {limits.max_concurrent_requests}",
                code="concurrency_limit_exceeded", retry_after_s=1.0, headers=self.headers(e),
            )
        if e.requests and e.requests.level < 1:
            waits.append(("requests", e.requests.wait_s(1)))
        if e.tokens and e.tokens.level < tokens:
            waits.append(("tokens", e.tokens.wait_s(tokens)))
        if waits:
            kind, wait = max(waits, key=lambda w: w[1])
            limit = int((e.requests if kind == "requests" else e.tokens).capacity)  # type: ignore[union-attr]
            raise TooManyRequests(
                f"rate limit reached for model {model!r}: {limit} {kind} per minute; retry in {_fmt(wait)}",
                code=f"rate_limit_{kind}", retry_after_s=wait, headers=self.headers(e),
            )
        if e.requests:
            e.requests.level -= 1
        if e.tokens:
            e.tokens.level -= tokens
        e.concurrent += 1
        return Admission(key, tokens, self.headers(e))

    def settle(self, admission: Admission, used_tokens: int | None, now: float) -> None:
        """The request ended: free its concurrency slot and correct the token estimate."""
        e = self._entries.get(admission.key)
        if e is None:
            return
        e.concurrent = max(e.concurrent - 1, 0)
        if e.tokens and used_tokens is not None:
            e.tokens.refill(now)
            # Refund what was reserved but not used (or charge what was used beyond it).
            e.tokens.level = min(e.tokens.capacity, e.tokens.level + admission.reserved_tokens - used_tokens)

    @staticmethod
    def headers(e: _Entry) -> dict[str, str]:
        h: dict[str, str] = {}
        if e.requests:
            h["x-ratelimit-limit-requests"] = str(int(e.requests.capacity))
            h["x-ratelimit-remaining-requests"] = str(max(int(e.requests.level), 0))
            h["x-ratelimit-reset-requests"] = _fmt(e.requests.reset_s())
        if e.tokens:
            h["x-ratelimit-limit-tokens"] = str(int(e.tokens.capacity))
            h["x-ratelimit-remaining-tokens"] = str(max(int(e.tokens.level), 0))
            h["x-ratelimit-reset-tokens"] = _fmt(e.tokens.reset_s())
        return h
