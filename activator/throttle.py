"""Throttling of requests with a missing or invalid API key, per client address.

API keys are 256-bit random values: guessing one is hopeless however fast an address
asks, so this is no defence of the keys. What it bounds is the work and the log volume
that one address can cause with bad keys: past a burst (``server.failed_auth.burst``,
refilled at ``refill_per_s``) its bad-key requests get 429 with ``Retry-After``
instead of 401, and are not logged one by one. A request with a valid key is always
checked and served as usual, from a throttled address too, so the throttle never locks
a tenant out (say, behind a NAT shared with a misconfigured client).

The buckets live in this activator process's memory (``--workers N`` and every
activator have their own), at most ``max_addresses`` of them: the least recently seen
address is forgotten first. The address is the ASGI scope's ``client`` as uvicorn sets
it: the peer, or ``X-Forwarded-For`` when the peer is a trusted proxy (uvicorn's
``FORWARDED_ALLOW_IPS``, by default only this host: 127.0.0.1 and ::1).

``spend`` is the policy, pure with time passed in; ``FailedAuthThrottle`` keeps the
buckets.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from activator.limits import Bucket
from thaw.config import FailedAuthThrottle as FailedAuthConfig


@dataclass(frozen=True)
class Address:
    """An address's bucket of failures (``activator.limits.Bucket``, refilled at
    ``refill_per_s``), and whether it is being refused since its last spend (an address
    that starts being refused is logged once)."""

    bucket: Bucket
    refusing: bool = False


@dataclass(frozen=True)
class Verdict:
    """Seconds until the address may fail again (0: this failure is answered 401), and
    whether it was refused just now for the first time since it was last allowed."""

    retry_after_s: float
    newly_throttled: bool = False


def spend(address: Address | None, now: float, cfg: FailedAuthConfig) -> tuple[Verdict, Address]:
    """One failed authentication from ``address`` (None: unseen), as a new state."""
    b = Bucket.full(cfg.burst, now, cfg.refill_per_s) if address is None else replace(address.bucket)
    b.refill(now)
    if b.level >= 1:
        b.level -= 1
        return Verdict(0.0), Address(b)
    newly = address is None or not address.refusing
    return Verdict(b.wait_s(1), newly), Address(b, refusing=True)


class FailedAuthThrottle:
    """The buckets of one activator process, by client address (bounded, LRU)."""

    def __init__(self, cfg: FailedAuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self._buckets: OrderedDict[str, Address] = OrderedDict()

    def failed(self, address: str) -> Verdict:
        """Count a failed authentication from ``address``."""
        verdict, bucket = spend(self._buckets.pop(address, None), self.clock(), self.cfg)
        self._buckets[address] = bucket
        if len(self._buckets) > self.cfg.max_addresses:
            self._buckets.popitem(last=False)
        return verdict

    def __len__(self) -> int:
        return len(self._buckets)
