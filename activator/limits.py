"""Per-tenant, per-model admission limits as token buckets (pure; time passed in).

A tenant's ``limits`` apply to each model it uses: requests per minute, tokens per
minute (prompt tokens + the requested max tokens, reconciled with the real usage when
the answer ends) and concurrent requests. Over a limit: 429 with ``Retry-After`` and
OpenAI's ``x-ratelimit-*`` headers, which successful answers carry too.

Two backends implement :class:`Limiter`: ``local`` (these buckets, in this activator's
memory) and ``redis`` (``activator.limits_redis``: the same buckets in Redis, shared by
every activator, with this activator's share of each limit as the fallback while Redis
cannot be reached).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from activator.errors import TooManyRequests
from thaw.config import LimitsConfig, RateLimits

if TYPE_CHECKING:
    from activator.metrics import ActivatorMetrics


@dataclass
class Bucket:
    """``capacity`` tokens, refilled continuously at ``per_s`` a second (None: the
    capacity per minute, as the rate limits are stated)."""

    capacity: float
    level: float
    updated: float
    per_s: float | None = None

    @classmethod
    def full(cls, capacity: float, now: float, per_s: float | None = None) -> Bucket:
        return cls(capacity, capacity, now, per_s)

    @property
    def rate(self) -> float:
        return self.capacity / 60.0 if self.per_s is None else self.per_s

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 if it is now)."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level) / self.rate


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


def rate_headers(requests: Bucket | None, tokens: Bucket | None) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the buckets a tenant has."""
    h: dict[str, str] = {}
    if requests:
        h["x-ratelimit-limit-requests"] = str(int(requests.capacity))
        h["x-ratelimit-remaining-requests"] = str(max(int(requests.level), 0))
        h["x-ratelimit-reset-requests"] = _fmt(requests.reset_s())
    if tokens:
        h["x-ratelimit-limit-tokens"] = str(int(tokens.capacity))
        h["x-ratelimit-remaining-tokens"] = str(max(int(tokens.level), 0))
        h["x-ratelimit-reset-tokens"] = _fmt(tokens.reset_s())
    return h


def tokens_exceeded(tokens: int, limit: int, headers: dict[str, str]) -> TooManyRequests:
    return TooManyRequests(
        f"this request needs {tokens} tokens (prompt + max tokens), more than the tenant's limit of "
        f"{limit} tokens per minute; lower max_tokens",
        code="tokens_exceeded", headers=headers,
    )


def concurrency_exceeded(model: str, limit: int, headers: dict[str, str]) -> TooManyRequests:
    return TooManyRequests(
        f"too many concurrent requests for model {model!r}: the limit is {limit}",
        code="concurrency_limit_exceeded", retry_after_s=1.0, headers=headers,
    )


def rate_exceeded(kind: str, model: str, limit: int, wait_s: float, headers: dict[str, str]) -> TooManyRequests:
    """``kind``: "requests" or "tokens"."""
    return TooManyRequests(
        f"rate limit reached for model {model!r}: {limit} {kind} per minute; retry in {_fmt(wait_s)}",
        code=f"rate_limit_{kind}", retry_after_s=wait_s, headers=headers,
    )


def share(limits: RateLimits, activators: int) -> RateLimits:
    """One activator's part of a limit shared by ``activators``: ``ceil(limit / n)``, so
    together they admit at most a little over the limit, and each at least 1."""
    n = max(activators, 1)

    def part(v: int | None) -> int | None:
        return None if v is None else math.ceil(v / n)

    return RateLimits(requests_per_minute=part(limits.requests_per_minute),
                      tokens_per_minute=part(limits.tokens_per_minute),
                      max_concurrent_requests=part(limits.max_concurrent_requests))


class Limiter(Protocol):
    """What the request path needs of a limits backend (``local`` or ``redis``).

    ``now`` is the activator's clock; a backend with a clock of its own (Redis's, shared
    by every activator) may ignore it. Only ``TooManyRequests`` leaves ``admit``; nothing
    leaves ``settle``.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def admit(self, tenant: str, model: str, limits: RateLimits, tokens: int, now: float) -> Admission: ...

    async def settle(self, admission: Admission, used_tokens: int | None, now: float) -> None: ...


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
        # A limit that changed (a degraded share when the number of activators moves):
        # the bucket takes the new capacity, keeping no more than it holds.
        e.requests = _resized(e.requests, limits.requests_per_minute, now)
        e.tokens = _resized(e.tokens, limits.tokens_per_minute, now)
        return e

    def admit(self, tenant: str, model: str, limits: RateLimits, tokens: int, now: float) -> Admission:
        """Take one request and ``tokens`` from the buckets, or raise 429 taking nothing."""
        key = (tenant, model)
        e = self._entry(key, limits, now)
        if e.tokens and tokens > e.tokens.capacity:
            raise tokens_exceeded(tokens, int(e.tokens.capacity), self.headers(e))
        waits = []
        if limits.max_concurrent_requests and e.concurrent >= limits.max_concurrent_requests:
            raise concurrency_exceeded(model, limits.max_concurrent_requests, self.headers(e))
        if e.requests and e.requests.level < 1:
            waits.append(("requests", e.requests.wait_s(1)))
        if e.tokens and e.tokens.level < tokens:
            waits.append(("tokens", e.tokens.wait_s(tokens)))
        if waits:
            kind, wait = max(waits, key=lambda w: w[1])
            limit = int((e.requests if kind == "requests" else e.tokens).capacity)  # type: ignore[union-attr]
            raise rate_exceeded(kind, model, limit, wait, self.headers(e))
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
        return rate_headers(e.requests, e.tokens)


def _resized(bucket: Bucket | None, capacity: int | None, now: float) -> Bucket | None:
    if not capacity:
        return None
    if bucket is None:
        return Bucket.full(capacity, now)
    if bucket.capacity != capacity:
        bucket.capacity = float(capacity)
        bucket.level = min(bucket.level, bucket.capacity)
    return bucket


class LocalLimiter:
    """``limits.backend: local``: the buckets in this activator's memory (limits are
    then per activator). One of ``processes`` worker processes sharing a port
    (`thaw activator --workers N`) takes its share of each limit, so that together
    they admit no more than the limit."""

    def __init__(self, processes: int = 1) -> None:
        self.buckets = RateLimiter()
        self.processes = processes

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def admit(self, tenant: str, model: str, limits: RateLimits, tokens: int, now: float) -> Admission:
        if self.processes > 1:
            limits = share(limits, self.processes)
        return self.buckets.admit(tenant, model, limits, tokens, now)

    async def settle(self, admission: Admission, used_tokens: int | None, now: float) -> None:
        self.buckets.settle(admission, used_tokens, now)


def build_limiter(cfg: LimitsConfig, metrics: ActivatorMetrics, *, owner: str,
                  activators: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                  processes: int = 1) -> Limiter:
    """The backend ``cfg.backend`` names. ``owner`` (the activator's id) names its
    concurrency leases; ``activators()`` is how many activators share a limit, for this
    one's share while Redis is out of reach; ``processes``: how many worker processes
    of one activator share its port (each takes its share of a local limit)."""
    if cfg.backend == "local":
        return LocalLimiter(processes)
    if cfg.backend == "redis":
        from activator.limits_redis import RedisLimiter

        return RedisLimiter(cfg, metrics, owner=owner, activators=activators, clock=clock)
    raise ValueError(f"unknown limits backend {cfg.backend!r}; valid: 'local', 'redis'")
