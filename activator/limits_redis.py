"""``limits.backend: redis``: tenants' limits counted once for every activator, in Redis.

The buckets of ``activator.limits``, kept in Redis and stepped by Lua scripts, so each
admission is one atomic round trip whatever the number of activators. Time inside the
scripts is Redis's own (``TIME``), the same for every activator. Per tenant and model:

- ``<prefix>:{tenant/model}:buckets``, a hash: the request and token buckets' levels and
  when each was last refilled. It expires once the buckets would be full again, so an
  idle tenant leaves nothing behind.
- ``<prefix>:{tenant/model}:leases``, a sorted set: one member per request in flight
  (the concurrency limit), scored by when it expires. The activator holding a lease
  pushes its expiry forward every ``lease_ttl_s / 3``; an activator that dies stops, and
  its leases lapse after ``lease_ttl_s``.

(The braces make both keys one Redis Cluster hash slot.)

When Redis cannot be reached within ``timeout_ms``, requests are decided by this
activator's own buckets at ``ceil(limit / activators)`` (the count comes with the route
table), the ``thaw_limits_degraded`` gauge is 1, and Redis is probed every
``retry_interval_s`` until it answers again. One log line when that starts, one when it
ends. Requests are never refused, nor let through unlimited, because Redis is away.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from activator.errors import TooManyRequests
from activator.limits import (
    Admission,
    Bucket,
    RateLimiter,
    concurrency_exceeded,
    rate_exceeded,
    rate_headers,
    share,
    tokens_exceeded,
)
from activator.metrics import ActivatorMetrics
from thaw.config import LimitsConfig, RateLimits
from thaw.log import get_logger

log = get_logger()

# Shared by the scripts: Redis's clock, and a bucket's level refilled up to now.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function refilled(cap, level, at)
  if cap <= 0 then return 0 end
  if not level then return cap end  -- no bucket (new, or expired once full): full
  level = math.min(tonumber(level), cap)  -- a lowered limit
  at = tonumber(at)
  if now > at then level = math.min(cap, level + (now - at) * cap / 60) end
  return level
end
local function store(key, field, cap, level)
  if cap > 0 then
    redis.call('HSET', key, field, level, field .. 't', now)
  else
    redis.call('HDEL', key, field, field .. 't')  -- a limit added later starts full
  end
end
local function expire_buckets(key, rpm, r, tpm, k)
  -- Gone once both buckets are full again: a missing bucket reads as full.
  local full_in = 0
  if rpm > 0 then full_in = math.max(full_in, (rpm - r) * 60 / rpm) end
  if tpm > 0 then full_in = math.max(full_in, (tpm - k) * 60 / tpm) end
  if redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, math.ceil(full_in * 1000) + 1000)
  end
end
local function expire_leases(key)
  -- Kept until the latest lease in it expires (leases may have different TTLs).
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, math.ceil(tonumber(last[2]) * 1000) + 1000)
  end
end
"""

# KEYS: buckets, leases. ARGV: requests/min, tokens/min, concurrent (0: no limit),
# tokens wanted, lease id, lease TTL (ms).
# Returns {verdict, requests level, tokens level, wait s, leases held}; verdict is
# "ok", "tokens_exceeded", "concurrency", "requests" or "tokens". A refusal takes nothing.
ADMIT = _PRELUDE + """
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local need, lease, ttl_ms = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local b = redis.call('HMGET', KEYS[1], 'r', 'rt', 'k', 'kt')
local r = refilled(rpm, b[1], b[2])
local k = refilled(tpm, b[3], b[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = redis.call('ZCARD', KEYS[2])
local verdict, wait = 'ok', 0
if tpm > 0 and need > tpm then
  verdict = 'tokens_exceeded'
elseif conc > 0 and held >= conc then
  verdict, wait = 'concurrency', 1
else
  local wr, wk = 0, 0
  if rpm > 0 and r < 1 then wr = (1 - r) * 60 / rpm end
  if tpm > 0 and k < need then wk = (need - k) * 60 / tpm end
  if wr > 0 and wr >= wk then verdict, wait = 'requests', wr
  elseif wk > 0 then verdict, wait = 'tokens', wk end
end
if verdict == 'ok' then
  if rpm > 0 then r = r - 1 end
  if tpm > 0 then k = k - need end
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + ttl_ms / 1000, lease)
    held = held + 1
    expire_leases(KEYS[2])
  end
end
store(KEYS[1], 'r', rpm, r)
store(KEYS[1], 'k', tpm, k)
expire_buckets(KEYS[1], rpm, r, tpm, k)
return {verdict, tostring(r), tostring(k), tostring(wait), held}
"""

# KEYS: buckets, leases. ARGV: requests/min, tokens/min, lease id, tokens reserved minus
# used (refunded; negative: charged).
SETTLE = _PRELUDE + """
redis.call('ZREM', KEYS[2], ARGV[3])
local rpm, tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if tpm > 0 and delta ~= 0 then
  local b = redis.call('HMGET', KEYS[1], 'r', 'rt', 'k', 'kt')
  local k = math.min(tpm, refilled(tpm, b[3], b[4]) + delta)
  store(KEYS[1], 'k', tpm, k)
  expire_buckets(KEYS[1], rpm, refilled(rpm, b[1], b[2]), tpm, k)
end
return 1
"""

# KEYS: leases. ARGV: lease TTL (ms), then the lease ids this activator still holds.
# Only leases still there are pushed forward (XX): one that lapsed stays gone.
REFRESH = _PRELUDE + """
local expiry = now + tonumber(ARGV[1]) / 1000
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i])
end
expire_leases(KEYS[1])
return n
"""


class _Conn(NamedTuple):
    redis: Redis
    admit: AsyncScript
    settle: AsyncScript
    refresh: AsyncScript


@dataclass(frozen=True)
class RedisAdmission(Admission):
    """Granted by Redis: the lease to give back and the limits it was taken under."""

    lease: str = ""
    limits: RateLimits = RateLimits()


class RedisLimiter:
    """The limits of every activator in one Redis (see the module's docstring)."""

    def __init__(self, cfg: LimitsConfig, metrics: ActivatorMetrics, *, owner: str,
                 activators: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        if cfg.url is None:
            raise ValueError("limits.backend 'redis' needs limits.url")
        self.cfg = cfg
        self.metrics = metrics
        self.owner = owner
        self.activators = activators
        self.clock = clock
        self.timeout_s = cfg.timeout_ms / 1000
        # This activator's share of each limit, used while Redis is out of reach.
        self.fallback = RateLimiter()
        self.degraded = False
        self._degraded_since = 0.0
        # Leases granted here and not settled yet, by lease id: (tenant, model).
        self.held: dict[str, tuple[str, str]] = {}
        self._conn: _Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        metrics.limits_degraded.set(0)

    # -- lifetime ---------------------------------------------------------------------
    def _client(self) -> _Conn:
        # Made on first use (no I/O): connections are opened by the first call.
        if self._conn is None:
            assert self.cfg.url is not None
            # No retries inside the client: the request path has timeout_ms, and a failure
            # is answered by the degraded share, not by waiting.
            r = Redis.from_url(self.cfg.url, decode_responses=True, socket_timeout=self.timeout_s,
                               socket_connect_timeout=self.timeout_s, retry=Retry(NoBackoff(), 0))
            self._conn = _Conn(r, r.register_script(ADMIT), r.register_script(SETTLE), r.register_script(REFRESH))
        return self._conn

    async def start(self) -> None:
        """Connect (without waiting for Redis: a Redis that is down is degraded mode from
        the start), then refresh leases and probe Redis in the background."""
        self._client()
        if not await self._ping():
            self._enter_degraded("no answer at start")
        self._task = asyncio.create_task(self._maintain(), name="limits-maintain")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            # redis-py may swallow a cancellation that lands in a disconnect: the flag
            # ends the loop anyway, and the wait is bounded.
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)
            self._task = None
        if self._conn is not None:
            try:
                await asyncio.wait_for(self._conn.redis.aclose(), 5)
            except Exception as exc:  # a Redis that is gone: nothing to close politely
                log.info("limits_store_close_failed", error=str(exc) or type(exc).__name__)
            self._conn = None

    # -- the request path -------------------------------------------------------------
    def keys(self, tenant: str, model: str) -> list[str]:
        tag = f"{self.cfg.key_prefix}:{{{tenant}/{model}}}"
        return [f"{tag}:buckets", f"{tag}:leases"]

    async def admit(self, tenant: str, model: str, limits: RateLimits, tokens: int, now: float) -> Admission:
        """Take from the shared buckets, or raise 429 taking nothing; while Redis is out
        of reach, from this activator's share."""
        rpm = limits.requests_per_minute or 0
        tpm = limits.tokens_per_minute or 0
        conc = limits.max_concurrent_requests or 0
        if not (rpm or tpm or conc):
            return Admission((tenant, model), tokens)  # nothing to count
        if not self.degraded:
            lease = f"{self.owner}:{uuid.uuid4().hex}"
            try:
                reply = await self._call("admit", self._client().admit(
                    keys=self.keys(tenant, model),
                    args=[rpm, tpm, conc, tokens, lease, round(self.cfg.lease_ttl_s * 1000)]))
                verdict, r, k, wait = str(reply[0]), float(reply[1]), float(reply[2]), float(reply[3])
            except Exception as exc:
                self._enter_degraded(_describe(exc))
            else:
                headers = rate_headers(Bucket(rpm, r, 0.0) if rpm else None, Bucket(tpm, k, 0.0) if tpm else None)
                if verdict == "ok":
                    if conc:
                        self.held[lease] = (tenant, model)
                    return RedisAdmission((tenant, model), tokens, headers, lease=lease if conc else "",
                                          limits=limits)
                raise self._refusal(verdict, model, tokens, rpm, tpm, conc, wait, headers)
        self.metrics.limits_degraded_admissions.inc()
        return self.fallback.admit(tenant, model, share(limits, self.activators()), tokens, now)

    async def settle(self, admission: Admission, used_tokens: int | None, now: float) -> None:
        """Give the lease back and correct the token estimate; never raises. While Redis
        is away, a lease it granted is left to lapse."""
        if not isinstance(admission, RedisAdmission):
            self.fallback.settle(admission, used_tokens, now)
            return
        self.held.pop(admission.lease, None)
        tpm = admission.limits.tokens_per_minute or 0
        delta = admission.reserved_tokens - used_tokens if (tpm and used_tokens is not None) else 0
        if self.degraded or not (admission.lease or delta):
            return
        tenant, model = admission.key
        try:
            await self._call("settle", self._client().settle(
                keys=self.keys(tenant, model),
                args=[admission.limits.requests_per_minute or 0, tpm, admission.lease, delta]))
        except Exception as exc:
            self._enter_degraded(_describe(exc))

    async def _call(self, op: str, aw: Awaitable[Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(aw, self.timeout_s)
        finally:
            self.metrics.limits_store_seconds.labels(op).observe(time.perf_counter() - t0)

    @staticmethod
    def _refusal(verdict: str, model: str, tokens: int, rpm: int, tpm: int, conc: int, wait: float,
                 headers: dict[str, str]) -> TooManyRequests:
        if verdict == "tokens_exceeded":
            return tokens_exceeded(tokens, tpm, headers)
        if verdict == "concurrency":
            return concurrency_exceeded(model, conc, headers)
        if verdict in ("requests", "tokens"):
            return rate_exceeded(verdict, model, rpm if verdict == "requests" else tpm, wait, headers)
        raise ValueError(f"unexpected verdict {verdict!r} from the limits script")

    # -- degraded mode ----------------------------------------------------------------
    def _enter_degraded(self, why: str) -> None:
        if self.degraded:
            return
        self.degraded = True
        self._degraded_since = self.clock()
        self.metrics.limits_degraded.set(1)
        log.warning("limits_degraded", error=why, activators=self.activators(),
                    message="the limits store failed or did not answer in time: admitting by this "
                            "activator's share of each limit (limit / activators) until it answers again")

    def _leave_degraded(self) -> None:
        if not self.degraded:
            return
        self.degraded = False
        self.metrics.limits_degraded.set(0)
        log.info("limits_restored", degraded_s=round(self.clock() - self._degraded_since, 3),
                 message="the limits store answers again: limits are shared across activators")

    async def _ping(self) -> bool:
        redis = self._client().redis
        try:
            # Connections idle since Redis went away are dead: open fresh ones.
            await redis.connection_pool.disconnect(inuse_connections=False)
            await self._call("ping", redis.ping())
            return True
        except Exception:
            return False

    async def _maintain(self) -> None:
        """Every retry_interval_s while degraded: probe Redis. Otherwise every
        lease_ttl_s / 3: push the expiry of the leases still held forward."""
        refresh_every = self.cfg.lease_ttl_s / 3
        next_refresh = self.clock() + refresh_every
        while not self._closing:
            await asyncio.sleep(min(self.cfg.retry_interval_s, refresh_every))
            try:
                if self.degraded:
                    if await self._ping():
                        self._leave_degraded()
                        next_refresh = self.clock()  # leases may be close to lapsing
                    continue
                if self.clock() >= next_refresh:
                    next_refresh = self.clock() + refresh_every
                    await self.refresh()
            except Exception:
                # Never let the loop die: without it leases lapse and degraded mode never ends.
                log.exception("limits_maintenance_failed")

    async def refresh(self) -> None:
        """Push forward the expiry of every lease this activator holds."""
        by_key: dict[tuple[str, str], list[str]] = {}
        for lease, key in list(self.held.items()):
            by_key.setdefault(key, []).append(lease)
        ttl_ms = round(self.cfg.lease_ttl_s * 1000)
        try:
            await asyncio.gather(*(
                self._call("refresh", self._client().refresh(keys=self.keys(*key)[1:], args=[ttl_ms, *leases]))
                for key, leases in by_key.items()
            ))
        except Exception as exc:
            self._enter_degraded(_describe(exc))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
